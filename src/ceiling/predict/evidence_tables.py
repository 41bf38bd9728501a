"""The raw rows of the measured tables for an op's shape: which tables an engine's kernel
family reads (``kernels.yaml`` patterns, or the user's backend choice) and the lookup of GEMM,
MoE and attention rows. Apart from :mod:`ceiling.predict.evidence`, which judges these rows
against the prior and adds the proxy, the cold cost and the floors.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Literal

from ceiling.predict.datafiles import kernels
from ceiling.predict.opspec import AttentionShape, GemmShape, MlaShape, MoeShape, OpSpec
from ceiling.predict.resolved import Setup

if TYPE_CHECKING:
    from types import ModuleType

    from ceiling.predict.tables import Measured

Kind = Literal["gemm", "moe", "attention"]
Skip = tuple[str, ...]  # table keys the evidence check refused for an op (tried next: the rest)


def table_patterns(engine: str, family: str, arch_class: str) -> list[tuple[str, str]]:
    rules = kernels().tables.get(engine, {}).get(family) or {}
    pats = rules.get(arch_class) or rules.get("default") or []
    return [(str(a), str(b)) for a, b in pats]


def chosen_patterns(
    s: Setup, kind: str, family: str, arch_class: str
) -> tuple[list[tuple[str, str]], str, bool]:
    """Table patterns of the user's backend choice for this family (its MoE rows take the
    default's dtypes), else the engine's default for the GPU class; a note; whether the
    patterns are the user's choice."""
    from ceiling.predict.choices import backend_patterns

    default = table_patterns(s.dep.engine, family, arch_class)
    user, note = backend_patterns(s, kind, family)
    if user is None:
        return default, note, False
    if kind == "moe":
        dtypes = list(dict.fromkeys(d for _, d in default)) or [""]
        user = [(n, d) for n, _ in user for d in dtypes]
    return user, note, True


class TableReads:
    """The table lookups of :class:`~ceiling.predict.evidence.Evidence` (a mixin: they read its
    setup's system, engine and GPU class)."""

    s: Setup
    cls: str
    engine: str
    system: str | None
    bw_ds: float
    tables: ModuleType | None

    def _measure(
        self, kind: Kind, op: OpSpec, family: str, tokens: float, skip: Skip = ()
    ) -> tuple[Measured | None, str, bool]:
        """The table's raw row for an op (before the proxy, the cold cost and the floors), the
        backend note, whether the rows are of a backend the user named."""
        look = {"gemm": self._gemm_meas, "moe": self._moe_meas, "attention": self._attn_meas}
        return look[kind](op, family, tokens, skip)

    def _gemm_meas(
        self, op: OpSpec, family: str, m: float, skip: Skip
    ) -> tuple[Measured | None, str, bool]:
        sh = op.shape
        assert isinstance(sh, GemmShape) and self.tables is not None and self.system
        if op.name in ("mla.w_uk_bmm", "mla.w_uv_bmm"):
            return None, "", False
        pats = table_patterns(self.engine, family, self.cls)
        meas = self.tables.gemm_measured(
            self.system, self.engine, pats, m, int(sh.n), int(sh.k), skip
        )
        return meas, "", False

    def _moe_meas(
        self, op: OpSpec, family: str, tokens: float, skip: Skip
    ) -> tuple[Measured | None, str, bool]:
        sh = op.shape
        assert isinstance(sh, MoeShape) and self.tables is not None and self.system
        pats, bnote, _chosen = chosen_patterns(self.s, "moe", family, self.cls)
        meas = self.tables.moe_measured(
            self.system,
            self.engine,
            pats,
            tokens,
            int(sh.hidden),
            int(sh.inter),
            int(sh.experts),
            int(sh.topk),
            int(sh.moe_tp),
            skip,
        )
        return meas, bnote, False

    def _attn_meas(
        self, op: OpSpec, family: str, batch: float, skip: Skip
    ) -> tuple[Measured | None, str, bool]:
        sh = op.shape
        assert self.tables is not None and self.system
        if op.name == "mla.indexer_scores":
            return None, "", False
        from ceiling.predict.choices import kv_parallel_attention

        pats, bnote, chosen = chosen_patterns(self.s, "attention", family, self.cls)
        meas = None
        if family == "attn_gqa" and isinstance(sh, AttentionShape):
            kvd = sh.kv_dtype
            pats = [(a, b or kvd) for a, b in pats]
            meas = self.tables.attention_measured(
                self.system,
                self.engine,
                pats,
                batch,
                float(sh.context),
                int(sh.heads),
                int(sh.kv_heads),
                int(sh.head_dim),
                bw_GBps=self.bw_ds,
                kv_parallel=kv_parallel_attention(),
                skip=skip,
            )
        elif family == "attn_mla" and isinstance(sh, MlaShape):
            kvd = "fp8" if self.s.kv_bytes <= 1 else "bfloat16"
            pats = [(a, b or kvd) for a, b in pats]
            meas = self.tables.mla_measured(
                self.system, self.engine, pats, batch, float(sh.context), int(sh.heads), skip
            )
        return meas, bnote, chosen
