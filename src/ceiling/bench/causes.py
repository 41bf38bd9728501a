"""Why requests ended, said from the server's own answer: warnings that name the cause and its fix.

A request that ends early or fails says why in the server's words (``finish_reason``,
llama-server's ``stop_type``, the error text); with the context the server serves (``/v1/models``
``max_model_len``, llama-server's ``/props``) the arithmetic is exact: "prompt 128 + 384 generated
= 512 = the served context". A guess ("EOS or a stop string: pass --ignore-eos") is never said
when the server's answer names another reason, nor a fix that is already in effect.
"""

from __future__ import annotations

from ceiling.bench.failures import overflow_text, quote_messages
from ceiling.bench.metrics import EarlyEnd

#: Prompt + generated within this many tokens of the served context counts as "at the context"
#: (a server may stop a token early: llama-server ends when the next position would not fit).
AT_CONTEXT_SLACK = 4

RAISE_CONTEXT = "raise the context (vLLM --max-model-len, llama.cpp -c / --ctx-size)"


def failed_warning(failed: int, errors: dict[str, int], messages: dict[str, int]) -> str:
    """The failed requests with the server's words: kinds, then the messages."""
    kinds = ", ".join(f"{k} {v}" for k, v in errors.items())
    said = f"; the server said: {quote_messages(messages)}" if messages else ""
    return f"{failed} failed requests ({kinds}){said}"


def early_end_warning(
    end: EarlyEnd, completed: int, served_context: int | None, ignore_eos_sent: bool
) -> str:
    """One group of requests that ended before max_tokens: the cause and its fix."""
    head = f"{end.requests} of {completed} requests ended before max_tokens {end.max_tokens}"
    reason = end.finish_reason + (f", stop_type {end.stop_type}" if end.stop_type else "")
    if end.finish_reason == "length" or end.stop_type == "limit":
        return head + f" (finish_reason {reason}): " + _length_cause(end, served_context)
    if ignore_eos_sent:
        return (
            head + f" (finish_reason {reason}) though ignore_eos was sent: the server does not "
            "honour it; ban the EOS token with --logit-bias '{\"EOS_ID\": -100}' or lower "
            f"--max-tokens to about {end.output_tokens}"
        )
    return (
        head + f" (finish_reason {reason}: EOS or a stop string): drop --no-ignore-eos to "
        "generate exactly max_tokens"
    )


def _length_cause(end: EarlyEnd, served_context: int | None) -> str:
    """A ``length`` end before max_tokens: the context the server serves, or its own cap."""
    if end.prompt_tokens is None:
        return (
            f"{end.output_tokens} generated; the server's context or output cap ended them: "
            f"lower --max-tokens or {RAISE_CONTEXT}"
        )
    total = end.prompt_tokens + end.output_tokens
    sums = f"prompt {end.prompt_tokens} + {end.output_tokens} generated = {total}"
    if served_context is None:
        return (
            f"{sums}, most likely the server's context (it does not say which): lower "
            f"--max-tokens to {end.output_tokens} or less, or {RAISE_CONTEXT}"
        )
    if abs(served_context - total) <= AT_CONTEXT_SLACK:
        at = (
            "= the served context"
            if total == served_context
            else f"~ the served context {served_context}"
        )
        return (
            f"{sums} {at}: lower --max-tokens to "
            f"{max(served_context - end.prompt_tokens, 1)} or less, or {RAISE_CONTEXT}"
        )
    return (
        f"{sums}, below the served context ({served_context}): the server caps the output "
        "itself (llama.cpp -n / --n-predict, a generation limit): raise that cap or lower "
        "--max-tokens"
    )


def failure_fix(messages: dict[str, int]) -> str:
    """The fix of a run whose requests failed, from what the server said."""
    if any(overflow_text(m) for m in messages):
        return (
            "the requests do not fit the server's context: lower --input-len and/or "
            f"--max-tokens, or {RAISE_CONTEXT}"
        )
    return (
        "the server's messages are above and in error_messages of the result; fix their cause "
        "(raise --max-failed-pct only on purpose)"
    )
