"""Kernel-name tables per engine (``engines/data/trace/*.yaml``): which op class a GPU kernel
or CPU operator of a torch-profiler trace belongs to, and which profiler annotations mark an
engine's steps. Engine knowledge stays here, as data; ``ceiling.trace`` only applies it.

A name is looked up in the engine's table first, then in ``generic.yaml`` (NCCL, cuBLAS,
CUTLASS, FlashAttention, PyTorch's kernels, ATen CPU operators). The first pattern that matches
wins; no match is ``unmatched`` (listed by name, never lumped into a class).
"""

from __future__ import annotations

import re
from functools import cache
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator

from ceiling.spec._data import load_yaml

OpClass = Literal[
    "gemm",
    "gemm_qkv",
    "gemm_o",
    "gemm_gate_up",
    "gemm_down",
    "gemm_lm_head",
    "moe_experts",
    "moe_topk",
    "attention",
    "attention_mla",
    "gdn",
    "kv_write",
    "rope",
    "norm",
    "activation",
    "quant",
    "elementwise",
    "embedding",
    "sampling",
    "allreduce",
    "allgather",
    "reduce_scatter",
    "alltoall",
    "send_recv",
    "collective",
    "copy",
    "memset",
    "unmatched",
]

#: Collective classes: their time splits into transfer and waiting for the slowest rank.
COLLECTIVE_CLASSES = frozenset(
    {"allreduce", "allgather", "reduce_scatter", "alltoall", "send_recv", "collective"}
)

#: Engines with a table of their own (``engines/data/trace/<engine>.yaml``).
ENGINES = ("vllm", "sglang", "llamacpp")


def _check_regex(value: str) -> str:
    try:
        re.compile(value)
    except re.error as exc:
        raise ValueError(f"not a regular expression: {exc}") from exc
    return value


class KernelPattern(BaseModel):
    """One kernel-name pattern: a regex searched in the name, the op class it means."""

    model_config = ConfigDict(extra="forbid")

    match: str
    example: str = Field(min_length=1, description="a real name it matches (tested)")
    op_class: OpClass
    impl: str = Field("", description="implementation, e.g. nccl_{algo}_{proto}; {group} fields")
    source: str = Field(min_length=3, description="the engine source file the name comes from")

    _check = field_validator("match")(_check_regex)


class StepAnnotation(BaseModel):
    """A profiler annotation that wraps one engine step (named groups: context, generation)."""

    model_config = ConfigDict(extra="forbid")

    name: str = Field(min_length=1, description="how a person reads it")
    match: str
    source: str = Field(min_length=3)

    _check = field_validator("match")(_check_regex)


class PatternTable(BaseModel):
    model_config = ConfigDict(extra="forbid")

    schema_version: Literal[1] = 1
    engine: str
    step_annotations: list[StepAnnotation] = Field(default_factory=list)
    patterns: list[KernelPattern]


class Match(BaseModel):
    """What a name was classified as, and by which table's pattern."""

    op_class: OpClass
    impl: str = ""
    table: str = ""
    pattern: str = ""


@cache
def table(engine: str) -> PatternTable:
    """The pattern table of ``engine`` (``generic`` for the shared one)."""
    # a broken shipped table is an install problem: CeilingError naming the file and the key
    return load_yaml(f"trace/{engine}.yaml", folder="engines/data", schema=PatternTable)


def engine_name(engine: str | None) -> str | None:
    """The table for an engine name as the CLI and adapters spell it (llamacpp-python and
    llama.cpp share llama.cpp's kernels); None for an engine without a table."""
    if not engine:
        return None
    e = engine.lower().replace(".", "").replace("_", "-")
    if e.startswith("llamacpp") or e.startswith("llama-cpp"):
        return "llamacpp"
    return e if e in ENGINES else None


class Classifier:
    """Classifies names for one engine (cached per name: a trace repeats each kernel name
    thousands of times, the regexes run once per distinct name)."""

    def __init__(self, engine: str | None) -> None:
        self.engine = engine_name(engine)
        tables = [table(self.engine)] if self.engine else []
        tables.append(table("generic"))
        self._rules = [(re.compile(p.match), p, t.engine) for t in tables for p in t.patterns]
        self._steps = [(re.compile(a.match), a) for t in tables for a in t.step_annotations]
        self._cache: dict[str, Match] = {}

    def classify(self, name: str) -> Match:
        hit = self._cache.get(name)
        if hit is not None:
            return hit
        hit = Match(op_class="unmatched")
        for rx, pat, tname in self._rules:
            m = rx.search(name)
            if m is not None:
                impl = pat.impl
                if impl and m.groupdict():
                    impl = impl.format(**{k: (v or "").lower() for k, v in m.groupdict().items()})
                hit = Match(op_class=pat.op_class, impl=impl, table=tname, pattern=pat.match)
                break
        self._cache[name] = hit
        return hit

    def step_annotation(self, name: str) -> dict[str, str] | None:
        """The named groups of the first step-annotation pattern ``name`` matches, else None
        (engine annotations are listed before ProfilerStep#N)."""
        for rx, _ in self._steps:
            m = rx.match(name)
            if m is not None:
                return {k: v for k, v in m.groupdict().items() if v is not None}
        return None

    def step_patterns(self) -> list[tuple[re.Pattern[str], StepAnnotation]]:
        return list(self._steps)


def guess_engine(names: set[str]) -> str | None:
    """The engine whose own table names the most of ``names`` (kernel and annotation names of
    a trace that does not say which engine wrote it: vLLM 0.25's traces carry no
    ``vllm_version``), None when no engine's table names any or two tie. Patterns every
    engine shares live in ``generic.yaml`` and count for none."""
    scores: dict[str, int] = {}
    for engine in ENGINES:
        t = table(engine)
        rules = [re.compile(p.match) for p in t.patterns]
        steps = [re.compile(a.match) for a in t.step_annotations]
        n = sum(
            1
            for name in names
            if any(r.search(name) for r in rules) or any(r.match(name) for r in steps)
        )
        if n:
            scores[engine] = n
    if not scores:
        return None
    best = sorted(scores.items(), key=lambda kv: -kv[1])
    if len(best) > 1 and best[0][1] == best[1][1]:
        return None
    return best[0][0]
