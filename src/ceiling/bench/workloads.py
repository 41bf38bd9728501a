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
from ceiling.bench.config import length_bounds
from ceiling.bench.stream import RawStream
from ceiling.errors import CeilingError
from ceiling.inputs import read_text


@dataclass
class Prompt:
    """One request's input: a text prompt or chat messages, and optional per-prompt limits.

    ``followups``: the user turns 2..K of a multi-turn session (``--turns K``), each sent
    after the previous answer came back, with the whole history before it (:func:`next_turn`).
    """

    text: str | None = None
    messages: list[dict[str, Any]] | None = None
    expected_tokens: int | None = None
    max_tokens: int | None = None
    followups: list[Prompt] | None = None


@dataclass
class SyntheticSpec:
    """The synthetic workload: lengths (drawn per request within ``*_range``), the shared
    prefix, and the turns of a session (``BenchConfig``'s fields of the same names)."""

    input_len: int
    input_range: float = 0.0
    prefix_len: int = 0
    turns: int = 1
    # None: every request takes the run's max_tokens (no per-request budget)
    output_len: int | None = None
    output_range: float = 0.0


def _words(rng: np.random.Generator, n: int) -> list[str]:
    letters = np.array(list(string.ascii_lowercase))
    lens = rng.integers(3, 8, size=n)
    flat = letters[rng.integers(0, 26, size=int(lens.sum()))]
    out, pos = [], 0
    for ln in lens:
        out.append("".join(flat[pos : pos + ln]))
        pos += int(ln)
    return out


def _lengths(rng: np.random.Generator, n: int, length: int, ratio: float) -> list[int]:
    """``n`` lengths drawn uniformly from :func:`length_bounds` (all ``length`` at ratio 0)."""
    if ratio <= 0:
        return [length] * n
    low, high = length_bounds(length, ratio)
    return [int(x) for x in rng.integers(low, high + 1, size=n)]


#: Tokens per short random word assumed when the server has no /tokenize.
APPROX_TOKENS_PER_WORD = 1.5


async def _fit(
    client: Client,
    model: str,
    rng: np.random.Generator,
    target: int,
    per_word: float,
    head: str = "",
) -> tuple[str, int | None]:
    """``head`` + random words, the word count adjusted (5 tries) until the whole text has
    ``target`` tokens in the server's tokenizer; the text and its count (the closest one)."""
    words = _words(rng, max(1, round(target / per_word)) + 8)
    k = max(1, min(len(words), round(target / per_word)))
    best: tuple[int, int] | None = None

    def text(n: int) -> str:
        return head + " ".join(words[:n])

    for _attempt in range(5):
        n = await client.tokenize(model, text(k))
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
    return text(k_best), n_best


async def synthetic_prompts(
    client: Client, model: str, count: int, spec: SyntheticSpec | int, seed: int
) -> tuple[list[Prompt], str]:
    """``count`` unique prompts (sessions) of ``spec``; second value: how lengths were set.

    The default workload (one length, no prefix, one turn) draws the same words for a seed as
    before the other options existed; lengths, the prefix and later turns come from generators
    of their own (``[seed, k]``), so adding one option leaves the others' draws alone."""
    spec = spec if isinstance(spec, SyntheticSpec) else SyntheticSpec(input_len=spec)
    target = spec.input_len
    rng = np.random.default_rng(seed)
    probe = " ".join(_words(rng, max(2 * target, 16)))
    n_probe = await client.tokenize(model, probe)
    exact = n_probe is not None
    per_word = n_probe / max(2 * target, 16) if n_probe else APPROX_TOKENS_PER_WORD
    turns = spec.turns
    lens = _lengths(np.random.default_rng([seed, 1]), count * turns, target, spec.input_range)
    outs: list[int | None] = [None] * (count * turns)
    if spec.output_len is not None and spec.output_range > 0:
        outs = list(
            _lengths(
                np.random.default_rng([seed, 3]), count * turns, spec.output_len, spec.output_range
            )
        )
    head = ""
    if spec.prefix_len:
        # The same text opens every prompt: a system prompt or a shared document, as a prefix
        # cache sees it (its own length measured alone; the words after it begin with a space,
        # which starts a new token in the tokenizers served, so the prefix's tokens stay put).
        head_rng = np.random.default_rng([seed, 2])
        if exact:
            head, _ = await _fit(client, model, head_rng, spec.prefix_len, per_word)
        else:
            head = " ".join(_words(head_rng, max(1, round(spec.prefix_len / per_word))))
        head += " "
    later = np.random.default_rng([seed, 4])
    prompts: list[Prompt] = []
    for i in range(count):
        session: list[Prompt] = []
        for t in range(turns):
            j = i * turns + t
            lead = head if t == 0 else ""
            word_rng = rng if t == 0 else later
            if exact:
                text, n = await _fit(client, model, word_rng, lens[j], per_word, lead)
                if n is None:  # /tokenize stopped answering: the rest is approximate
                    exact = False
            else:
                rest = max(1, round((lens[j] - (spec.prefix_len if t == 0 else 0)) / per_word))
                text, n = lead + " ".join(_words(word_rng, rest)), None
            session.append(Prompt(text=text, expected_tokens=n, max_tokens=outs[j]))
        first = session[0]
        first.followups = session[1:] or None
        prompts.append(first)
    return prompts, "tokenize" if exact else "approximate"


def load_jsonl(path: Path, text: str | None = None) -> list[Prompt]:
    """Prompts from a JSONL file: ``{"prompt": str}`` or ``{"messages": [...]}`` per line,
    optional ``max_tokens`` (or ``output_len``). ``text``: the file's text, already read."""
    prompts = []
    if text is None:
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


def reply(raw: RawStream) -> tuple[str, int | None, int | None]:
    """The answer text of a finished stream and the server's usage (prompt, completion
    tokens): what the next turn of a session resends. Parsed once the stream is complete,
    never while it is live."""
    parts: list[str] = []
    prompt_n: int | None = None
    completion_n: int | None = None
    for _t, payload in raw.events:
        try:
            obj = json.loads(payload)
        except (json.JSONDecodeError, UnicodeDecodeError):
            continue
        if not isinstance(obj, dict):
            continue
        usage = obj.get("usage")
        if isinstance(usage, dict):
            prompt_n = (
                usage.get("prompt_tokens")
                if isinstance(usage.get("prompt_tokens"), int)
                else prompt_n
            )
            completion_n = (
                usage.get("completion_tokens")
                if isinstance(usage.get("completion_tokens"), int)
                else completion_n
            )
        for choice in obj.get("choices") or []:
            if not isinstance(choice, dict):
                continue
            delta = choice.get("delta")
            piece = delta.get("content") if isinstance(delta, dict) else choice.get("text")
            if isinstance(piece, str):
                parts.append(piece)
    return "".join(parts), prompt_n, completion_n


#: Between the previous answer and the next user turn of a completions-endpoint session (no
#: roles there: the history is one text, as a chat template would join it, minus the markup).
TURN_SEPARATOR = "\n"


def next_turn(previous: Prompt, raw: RawStream, user: Prompt, chat: bool) -> Prompt:
    """The request of the session's next turn: the previous request's prompt, the answer
    the server gave to it, then the next user turn. Its intended length: the server's own
    count of the previous prompt and answer plus the new turn's (None when one is unknown)."""
    answer, prompt_n, completion_n = reply(raw)
    known = (prompt_n, completion_n, user.expected_tokens)
    expected = None if any(n is None for n in known) else sum(n for n in known if n is not None)
    if chat:
        history = previous.messages or [{"role": "user", "content": previous.text or ""}]
        messages = [
            *history,
            {"role": "assistant", "content": answer},
            {"role": "user", "content": user.text or ""},
        ]
        return Prompt(messages=messages, expected_tokens=expected, max_tokens=user.max_tokens)
    text = (previous.text or "") + answer + TURN_SEPARATOR + (user.text or "")
    return Prompt(text=text, expected_tokens=expected, max_tokens=user.max_tokens)


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
