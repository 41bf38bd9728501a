"""``ResultModel``: the base of result nouns that keep their numbers as fields and word them.

A verdict's sentences are ``computed_field``s: computed from the numbers every time the noun is
dumped (so a file carries them for whoever reads it as JSON) and never read back: loading the
JSON recomputes them. Any other key a file holds that the noun does not know is an error, so a
schema drift between what ceiling writes and what it reads fails a test instead of passing
silently.

This is a schema base, not a render layer: printing a result for a person (Rich, ``--json``)
is ``ceiling.render``'s job; the sentences here are part of the result document itself.
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, model_validator


class ResultModel(BaseModel):
    """Strict on input (unknown keys are errors); computed sentences are recomputed, not read."""

    model_config = ConfigDict(extra="forbid")

    @model_validator(mode="before")
    @classmethod
    def _drop_computed(cls, data: Any) -> Any:
        if isinstance(data, dict) and cls.model_computed_fields:
            return {k: v for k, v in data.items() if k not in cls.model_computed_fields}
        return data
