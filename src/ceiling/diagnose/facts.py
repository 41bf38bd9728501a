"""EngineFacts with the findings derived from them (``ceiling inspect``'s result).

The facts themselves, and the adapters' log grammars that fill them, live in the engines layer
(``ceiling.engines.facts``; engines never import the diagnosis); the findings are the
diagnosis's, so this module adds them.
"""

from __future__ import annotations

from pydantic import Field

from ceiling.diagnose.finding_types import Finding
from ceiling.engines.facts import SCHEMA_VERSION
from ceiling.engines.facts import EngineFacts as LogFacts

__all__ = ["SCHEMA_VERSION", "EngineFacts", "LogFacts"]


class EngineFacts(LogFacts):
    """What an engine's start-up log says (``LogFacts``), and the findings derived from it."""

    findings: list[Finding] = Field(default_factory=list)
