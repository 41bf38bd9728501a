"""An engine's own split of a measured one-stream step: the bandwidth it reaches, the gap to the
datasheet split into parts that sum to the step, and what-ifs with numbers.

Why a module of nouns apart from both sides: an engine adapter computes the split with its own
predictor (``engines/llamacpp_gap.py`` for llama-server on a GPU) and the verdict carries it as
its gap accounting (``verdict.gap.bandwidth``); the engines never import the diagnosis, so the
nouns sit where both can read them, with no I/O in their closure.
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, Field

SCHEMA_VERSION = 1


class ServerCost(BaseModel):
    """The server's step against the engine's kernel benchmark on the same file and settings."""

    server_step_ms: float
    bench_step_ms: float = Field(description="the kernel benchmark's step, same settings")
    added_ms: float
    added_pct: float
    source: str
    server: str = Field(description="the server measured (the finding and the split name it)")
    bench: str = Field(description="the engine's kernel benchmark it is set against")


class GapPart(BaseModel):
    name: str
    ms: float
    who: Literal["nobody", "user", "engine"] = Field(
        description="nobody: physics and the GPU; user: a setting this run has off (its what-if's "
        "saving); engine: the engine's own cost and kernels (changed by the quant type or "
        "another engine: the what-ifs give numbers)"
    )
    why: str


class GapWhatIf(BaseModel):
    lever: Literal["quant type", "flash attention", "cuda graphs", "offload", "slots", "engine"]
    change: str
    step_ms: float = Field(description="the measured step with this change (estimate)")
    saves_ms: float = Field(description="measured step - step_ms (negative: costs)")
    source: str


#: the verdict's gap kinds of each part's ``who``: physics is fundamental, a setting the user
#: has off is configurable, the engine's own cost is what the engine's defaults leave
GAP_KIND_OF_WHO = {"nobody": "fundamental", "user": "configurable", "engine": "unexplained"}


class BandwidthGap(BaseModel):
    """At one stream: the fraction of the memory bandwidth reached, the gap split, what-ifs."""

    schema_version: int = SCHEMA_VERSION
    # the one kind written so far; kept as the files have it
    kind: Literal["llamacpp-bandwidth"] = "llamacpp-bandwidth"
    engine: str = Field(description="whose kernels (the report's section names it)")
    step_ms: float = Field(description="the measured single-stream step")
    bytes_per_step: float
    achieved_GBps: float
    datasheet_GBps: float
    pct_of_datasheet: float
    measured_peak_GBps: float | None = Field(None, description="best mat-vec measured")
    measured_peak_type: str | None = None
    pct_of_measured_peak: float | None = None
    bound_ms: float
    parts: list[GapPart] = Field(default_factory=list, description="sum to step_ms")
    what_ifs: list[GapWhatIf] = Field(default_factory=list)
    server: ServerCost | None = None
    sentence: str = ""

    def kind_ms(self, kind: str) -> float:
        """The parts of one verdict gap kind (fundamental, configurable, unexplained), summed."""
        return sum(p.ms for p in self.parts if GAP_KIND_OF_WHO[p.who] == kind)
