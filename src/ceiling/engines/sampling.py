"""Engine-neutral shapes of the requests ``ceiling sanity`` makes, and of their answers.

Each engine returns the log-probabilities of a *prompt* in its own way (vLLM's
``prompt_logprobs``; the OpenAI legacy ``echo`` + ``logprobs`` that SGLang and llama.cpp
implement); the adapters (``Engine.prompt_logprobs_request`` / ``read_prompt_logprobs``) turn
their answers into :class:`PromptLogprobs`, which is all the sanity gate reads.
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, Field


class PromptLogprobs(BaseModel):
    """log p(token_i | tokens before it) for each token of a prompt, as the server computed it.

    Position 0 has no log-probability (nothing precedes it): ``logprobs[0]`` is None.
    ``top1_ids``/``top1_tokens``: the server's most likely token at each position, where given.
    """

    token_ids: list[int] | None = None
    tokens: list[str] | None = None
    logprobs: list[float | None] = Field(default_factory=list)
    top1_ids: list[int | None] | None = None
    top1_tokens: list[str | None] | None = None
    source: str = ""


def read_openai_echo(choice: dict[str, Any], prompt_tokens: int | None) -> PromptLogprobs | None:
    """The OpenAI legacy shape: ``echo: true, logprobs: 1`` returns the prompt's tokens, then the
    generated ones, in ``choice.logprobs`` (``tokens``, ``token_logprobs``, ``top_logprobs``).

    ``prompt_tokens`` (from ``usage``) says where the prompt ends; token ids come from
    ``prompt_token_ids`` when the server adds them (``return_token_ids``).
    """
    lp = choice.get("logprobs")
    if not isinstance(lp, dict) or not lp.get("token_logprobs"):
        return None
    tokens = list(lp.get("tokens") or [])
    values = list(lp.get("token_logprobs") or [])
    tops = list(lp.get("top_logprobs") or [])
    n = prompt_tokens if prompt_tokens else len(values)
    ids = choice.get("prompt_token_ids")
    top1: list[str | None] = []
    for top in tops[:n]:
        if isinstance(top, dict) and top:
            top1.append(max(top.items(), key=lambda kv: kv[1])[0])
        else:
            top1.append(None)
    return PromptLogprobs(
        token_ids=[int(i) for i in ids[:n]] if isinstance(ids, list) else None,
        tokens=[str(t) for t in tokens[:n]],
        logprobs=[float(v) if v is not None else None for v in values[:n]],
        top1_tokens=top1 or None,
        source="echo + logprobs (OpenAI completions)",
    )
