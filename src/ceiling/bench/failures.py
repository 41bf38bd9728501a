"""No verdict from a failed run: what makes a run a failure, said as a statement.

- :func:`context_overflow`: a server's 400 that says the prompt plus ``max_tokens`` does not fit
  its context (vLLM: "This model's maximum context length is N tokens ...", llama.cpp:
  "exceeds the available context size", ``exceed_context_size_error``). It is named as such,
  with the lengths and the fix, instead of being taken for a server that rejects ``ignore_eos``
  and then "measuring" a handful of tokens per request.
- a stall: two streams in a row that send nothing for ``--stall-timeout`` seconds end the run
  (``RunResult.stalled``) instead of every further request waiting as long.
- :func:`failure_statement`: more failed requests than a set share of those sent
  (``--max-failed-pct``, default :data:`MAX_FAILED_PCT`): the numbers of such a run describe the
  requests that happened to pass, so no verdict is drawn from them.
"""

from __future__ import annotations

import re
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # the result model imports nothing of this module
    from ceiling.bench.results import RunResult

#: Default share of failed requests (%) above which a run is a failure (a few stray errors in
#: a long run are reported, not fatal; 1 in 10 is not a measurement).
MAX_FAILED_PCT = 5.0

_OVERFLOW = re.compile(
    r"maximum context length|context (?:length|size|window)|exceed_context_size"
    r"|max_model_len|prompt is too long|too many tokens|n_ctx",
    re.I,
)
_CTX = re.compile(
    r"(?:maximum context length is|available context size \(|context (?:length|size|window)"
    r"(?: is| of)?:?)\s*(\d+)",
    re.I,
)
_PROMPT = re.compile(
    r"(?:contains (?:at least )?|request \(|prompt of |your prompt has )(\d+)", re.I
)


def overflow_text(text: str) -> bool:
    """Whether a server's error text says the request does not fit its context (llama-server's
    "Context size has been exceeded.", vLLM's "maximum context length is N")."""
    return bool(_OVERFLOW.search(text))


def quote_messages(messages: dict[str, int], limit: int = 3) -> str:
    """``'Context size has been exceeded.' x144; ...``: the most common error texts."""
    items = list(messages.items())[:limit]
    text = "; ".join(f"{msg[:200]!r} x{n}" for msg, n in items)
    more = len(messages) - len(items)
    return text + (f"; {more} other message(s) in error_messages of the result" if more else "")


def context_overflow(error: str | None, prompt_tokens: int | None, max_tokens: int) -> str | None:
    """The statement for a context overflow in a 400's message (None: it is something else)."""
    text = error or ""
    if not _OVERFLOW.search(text):
        return None
    ctx = _CTX.search(text)
    prompt = _PROMPT.search(text)
    n_prompt = int(prompt.group(1)) if prompt else prompt_tokens
    lengths = [
        f"the server's context is {ctx.group(1)} tokens" if ctx else "the server's context",
        f"a request needs {n_prompt} prompt tokens + {max_tokens} output tokens"
        if n_prompt is not None
        else f"a request's prompt + {max_tokens} output tokens",
    ]
    return (
        f"context overflow: {lengths[1]}, more than {lengths[0]} "
        f"(server: {' '.join(text.split())[:200]!r})"
    )


#: The fix of a context overflow (the options of bench and doctor, and the engines' flags).
OVERFLOW_FIX = (
    "lower --input-len and/or --max-tokens so that prompt + output fit the server's context, "
    "or serve a longer context (vLLM --max-model-len, llama.cpp -c)"
)


def failure_statement(result: RunResult, max_failed_pct: float = MAX_FAILED_PCT) -> str | None:
    """Why ``result`` is a failed run (None: it is a measurement): a context overflow, no
    completed request, or more failed requests than ``max_failed_pct`` % of those sent."""
    for named in (result.context_overflow, result.stalled):
        if named:
            return named
    levels = result.levels or [result]
    done = sum(lv.completed for lv in levels)
    failed = sum(lv.failed for lv in levels)
    errors: dict[str, int] = {}
    messages: dict[str, int] = {}
    for lv in levels:
        for kind, n in lv.errors.items():
            errors[kind] = errors.get(kind, 0) + int(n)
        for msg, n in lv.error_messages.items():
            messages[msg] = messages.get(msg, 0) + int(n)
    said = (
        f"; the server said: {quote_messages(dict(sorted(messages.items(), key=lambda kv: -kv[1])))}"
        if messages
        else ""
    )
    sent = done + failed
    if sent == 0:
        return None
    if done == 0:
        return f"no request completed ({failed} failed; errors: {errors or 'none recorded'}{said})"
    share = 100.0 * failed / sent
    if share > max_failed_pct:
        return (
            f"{failed} of {sent} requests failed ({share:.0f} % > the {max_failed_pct:g} % "
            f"allowed by --max-failed-pct; errors: {errors}{said}): no verdict from such a run"
        )
    return None
