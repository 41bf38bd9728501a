"""Prompts (synthetic at a target token length, or a JSONL file) and arrival schedules.

Synthetic prompts are random lowercase words, unique per request so that a prefix cache cannot
flatter TTFT. When the server has ``/tokenize`` the word count is adjusted until the prompt has
the target length in the server's own tokenizer; otherwise the length is approximate and the
real lengths come back from ``usage``.
"""

from __future__ import annotations

import json
import string
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from ceiling.bench.client import Client
from ceiling.errors import CeilingError
from ceiling.inputs import read_text


@dataclass
class Prompt:
    """One request's input: a text prompt or chat messages, and optional per-prompt limits."""

    text: str | None = None
    messages: list[dict[str, Any]] | None = None
    expected_tokens: int | None = None
    max_tokens: int | None = None


def _words(rng: np.random.Generator, n: int) -> list[str]:
    letters = np.array(list(string.ascii_lowercase))
    lens = rng.integers(3, 8, size=n)
    flat = letters[rng.integers(0, 26, size=int(lens.sum()))]
    out, pos = [], 0
    for ln in lens:
        out.append("".join(flat[pos : pos + ln]))
        pos += int(ln)
    return out


async def synthetic_prompts(
    client: Client, model: str, count: int, target: int, seed: int
) -> tuple[list[Prompt], str]:
    """``count`` unique prompts of ``target`` tokens; second value: how lengths were set."""
    rng = np.random.default_rng(seed)
    probe = " ".join(_words(rng, max(2 * target, 16)))
    n_probe = await client.tokenize(model, probe)
    if n_probe is None:
        # No tokenizer endpoint: assume ~1.5 tokens per short random word.
        per_word = 1.5
        prompts = [
            Prompt(text=" ".join(_words(rng, max(1, round(target / per_word)))))
            for _ in range(count)
        ]
        return prompts, "approximate"
    per_word = n_probe / max(2 * target, 16)
    prompts = []
    for _ in range(count):
        words = _words(rng, max(1, round(target / per_word)) + 8)
        k = max(1, min(len(words), round(target / per_word)))
        best: tuple[int, int] | None = None
        for _attempt in range(5):
            n = await client.tokenize(model, " ".join(words[:k]))
            if n is None:
                break
            if best is None or abs(n - target) < abs(best[1] - target):
                best = (k, n)
            if n == target:
                break
            step = round((target - n) / per_word) or (1 if n < target else -1)
            k = max(1, k + step)
            if k > len(words):
                words += _words(rng, k - len(words))
        k_best, n_best = best if best else (k, None)
        prompts.append(Prompt(text=" ".join(words[:k_best]), expected_tokens=n_best))
    return prompts, "tokenize"


def load_jsonl(path: Path) -> list[Prompt]:
    """Prompts from a JSONL file: ``{"prompt": str}`` or ``{"messages": [...]}`` per line,
    optional ``max_tokens`` (or ``output_len``)."""
    prompts = []
    text = read_text(path, "--dataset", fix="pass a JSONL file: one JSON object per line")
    for n, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        try:
            obj = json.loads(line)
        except json.JSONDecodeError as err:
            raise CeilingError(
                f"{path}:{n}: not JSON ({err.msg})", fix="one JSON object per line"
            ) from err
        if not isinstance(obj, dict) or not (
            isinstance(obj.get("prompt"), str) or isinstance(obj.get("messages"), list)
        ):
            raise CeilingError(
                f"{path}:{n}: needs a 'prompt' string or a 'messages' list",
                fix='e.g. {"prompt": "Hello", "max_tokens": 128}',
            )
        mt = obj.get("max_tokens", obj.get("output_len"))
        prompts.append(
            Prompt(
                text=obj.get("prompt"),
                messages=obj.get("messages"),
                max_tokens=int(mt) if isinstance(mt, int | float) else None,
            )
        )
    if not prompts:
        raise CeilingError(f"{path} holds no prompts", fix="one JSON object per line")
    return prompts


def request_body(
    prompt: Prompt,
    *,
    model: str,
    chat: bool,
    max_tokens: int,
    ignore_eos: bool,
    temperature: float | None,
    logit_bias: dict[str, float] | None = None,
) -> bytes:
    """Serialized streaming request (done before the send timestamp is taken)."""
    body: dict[str, Any] = {
        "model": model,
        "max_tokens": max_tokens,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    if chat:
        body["messages"] = prompt.messages or [{"role": "user", "content": prompt.text or ""}]
    else:
        if prompt.text is None:
            raise CeilingError(
                "chat messages in the dataset need --chat",
                fix="add --chat (uses /v1/chat/completions)",
            )
        body["prompt"] = prompt.text
    if ignore_eos:
        # vLLM/SGLang extensions: generate exactly max_tokens so that runs are comparable.
        body["ignore_eos"] = True
        body["min_tokens"] = max_tokens
    if temperature is not None:
        body["temperature"] = temperature
    if logit_bias:
        # OpenAI's field; banning the special tokens (-100) gives exactly max_tokens on servers
        # without ignore_eos (llama.cpp)
        body["logit_bias"] = logit_bias
    return json.dumps(body, separators=(",", ":")).encode()


def arrival_offsets(n: int, rate: float, burstiness: float, rng: np.random.Generator) -> np.ndarray:
    """Send times (s from start) for ``n`` requests: gamma-distributed gaps with mean 1/rate.

    ``burstiness`` 1 is a Poisson process; below 1 burstier, above 1 more regular (the same
    parametrization as ``vllm bench serve``).
    """
    gaps = rng.gamma(shape=burstiness, scale=1.0 / (rate * burstiness), size=n)
    gaps[0] = 0.0
    return np.cumsum(gaps)
