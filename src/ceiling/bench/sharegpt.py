"""ShareGPT-format datasets: the public format ``vllm bench serve --dataset-name sharegpt``
and guidellm read, a JSON list of ``{"conversations": [{"from": "human"|"gpt", "value": ...},
...]}``.

Each conversation gives one request: its first ``human`` turn is the prompt, and the length of
the ``gpt`` turn that answers it is the request's output budget (unless ``--max-tokens`` is
given). Conversations are shuffled by the seed and taken in that order, keeping those that
pass vLLM's filter (:func:`keep`), until the run has enough; fewer than needed are reused
cyclically (vLLM oversamples). Lengths are counted by the server's own ``/tokenize``; without
it they are estimated (:data:`APPROX_CHARS_PER_TOKEN`) and the source says ``approximate``.
"""

from __future__ import annotations

import itertools
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from ceiling.bench.client import Client
from ceiling.bench.workloads import Prompt
from ceiling.errors import CeilingError

#: vLLM's filter (``is_valid_sequence``): prompts and answers shorter than this are dropped...
MIN_TOKENS = 4
#: ...and prompts longer than this, and prompt + answer longer than MAX_TOTAL_TOKENS.
MAX_PROMPT_TOKENS = 1024
MAX_TOTAL_TOKENS = 2048
#: Characters per token assumed when the server cannot count (English text, BPE tokenizers).
APPROX_CHARS_PER_TOKEN = 4.0

FIX = 'a JSON list of {"conversations": [{"from": "human", "value": ...}, {"from": "gpt", ...}]}'


@dataclass
class Exchange:
    """The first human turn of one conversation and the gpt turn that answers it."""

    prompt: str
    answer: str


def _is_sharegpt(data: Any) -> bool:
    """The auto-detection: a JSON list whose first object has a ``conversations`` list."""
    first = next((e for e in data if isinstance(e, dict)), None) if isinstance(data, list) else None
    return first is not None and isinstance(first.get("conversations"), list)


def first_exchange(entry: Any) -> Exchange | None:
    """The first human turn followed by a gpt turn, or None (no such pair: skipped)."""
    turns = entry.get("conversations") if isinstance(entry, dict) else None
    if not isinstance(turns, list):
        return None
    for a, b in itertools.pairwise(turns):
        if not (isinstance(a, dict) and isinstance(b, dict)):
            continue
        if a.get("from") == "human" and b.get("from") == "gpt":
            if isinstance(a.get("value"), str) and isinstance(b.get("value"), str):
                return Exchange(a["value"], b["value"])
            return None
    return None


def read_exchanges(text: str, path: Path, fmt: str) -> list[Exchange] | None:
    """Every usable exchange of a ShareGPT file, in file order, its JSON decoded once (a
    multi-megabyte ShareGPT dump takes seconds to decode: detection and reading share it).
    ``fmt`` ``auto``: None when the text is not a ShareGPT file (then it is read as JSONL)."""
    head = text.lstrip()
    if fmt == "auto" and not head.startswith("["):
        return None  # a JSONL line is an object, never a list: no need to decode
    try:
        data = json.loads(head)
    except json.JSONDecodeError as err:
        if fmt == "auto":
            return None
        raise CeilingError(f"{path}: not JSON ({err.msg}, line {err.lineno})", fix=FIX) from err
    if fmt == "auto" and not _is_sharegpt(data):
        return None
    if not isinstance(data, list):
        raise CeilingError(f"{path}: a ShareGPT file is a JSON list", fix=FIX)
    found = [ex for ex in (first_exchange(e) for e in data) if ex is not None]
    if not found:
        raise CeilingError(
            f"{path}: none of its {len(data)} entries has a human turn answered by a gpt turn",
            fix=FIX,
        )
    return found


def keep(prompt_len: int, output_len: int, output_given: bool) -> bool:
    """vLLM's filter: prompt and answer at least 4 tokens (the answer's length unchecked when
    the output budget is given), prompt at most 1024, prompt + answer at most 2048."""
    if prompt_len < MIN_TOKENS or (not output_given and output_len < MIN_TOKENS):
        return False
    return prompt_len <= MAX_PROMPT_TOKENS and prompt_len + output_len <= MAX_TOTAL_TOKENS


async def _count(client: Client, model: str, text: str) -> int | None:
    return await client.tokenize(model, text) if text else 0


async def sharegpt_prompts(
    client: Client,
    model: str,
    exchanges: list[Exchange],
    count: int,
    seed: int,
    max_tokens: int | None,
    path: Path,
) -> tuple[list[Prompt], str]:
    """Up to ``count`` prompts from ``exchanges``: shuffled by ``seed``, filtered as vLLM
    does; ``max_tokens`` (the user's) replaces each answer's length as the output budget."""
    order = np.random.default_rng(seed).permutation(len(exchanges))
    exact = True
    prompts: list[Prompt] = []
    for i in order:
        if len(prompts) >= count:
            break
        ex = exchanges[int(i)]
        n_prompt = await _count(client, model, ex.prompt) if exact else None
        n_answer = await _count(client, model, ex.answer) if exact else None
        if n_prompt is None or n_answer is None:
            exact = False  # no /tokenize: every length of this run is an estimate
            n_prompt = round(len(ex.prompt) / APPROX_CHARS_PER_TOKEN)
            n_answer = round(len(ex.answer) / APPROX_CHARS_PER_TOKEN)
        out = max_tokens if max_tokens is not None else n_answer
        if not keep(n_prompt, out, max_tokens is not None):
            continue
        prompts.append(
            Prompt(
                text=ex.prompt,
                expected_tokens=n_prompt if exact else None,
                max_tokens=None if max_tokens is not None else out,
            )
        )
    if not prompts:
        raise CeilingError(
            f"{path}: no conversation passes vLLM's length filter (prompt and answer >= "
            f"{MIN_TOKENS} tokens, prompt <= {MAX_PROMPT_TOKENS}, both <= {MAX_TOTAL_TOKENS})",
            fix="use conversations of ordinary length, or a JSONL dataset (no filter)",
        )
    return prompts, "tokenize" if exact else "approximate"
