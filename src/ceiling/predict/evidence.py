"""Each op's latency from the best evidence, and its physical bound.

``expected`` (what this engine's default kernels deliver), per call, from the first of:

1. ``profile``: a family fit measured on this box (``ceiling calibrate --ops``; the bf16 GEMV
   fit of plain ``calibrate`` counts for ``gemm_bf16``);
2. ``table``: aiconfigurator's measured latency for the engine's kernel at this shape (optional
   extra, ``ceiling.predict.tables``), checked against the prior (a row more than 3x the prior
   and 20 us over it is a measurement artifact, not evidence: flagged, and the next candidate
   table of the format is read);
3. ``prior``: ``t0 + bytes / (eff x datasheet bandwidth)`` for the GPU class and kernel family
   (``data/predict/kernel_priors.yaml``, fitted to per-op tables; a class without data borrows
   the nearest class's numbers at lower confidence).

Table and prior fixed costs come from kernels timed in a loop, whose small weights sit in L2;
a decode step streams them from DRAM, so both add ``table_cold_us`` (constants.yaml: the
difference between a cold-cache GEMV intercept and the tables' on one H200).

``bound`` (the physics for this hardware and layout), per call: bytes at
``bound_bw_fraction`` x datasheet bandwidth (or a faster measured figure), FLOPs at the dense
peak, whichever is larger, plus ``bound_op_us`` for ops that carry a data dependency (GEMMs,
attention, MoE); elementwise ops are fusable (no fixed cost); collectives at the fastest
algorithm the link allows (``ceiling.predict.comm``); no host time.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING

from ceiling.predict.datafiles import KernelPrior, kernel_priors, kernels
from ceiling.predict.evidence_tables import (
    Kind as _Kind,
)
from ceiling.predict.evidence_tables import (
    Skip as _Skip,
)
from ceiling.predict.evidence_tables import (
    TableReads,
)
from ceiling.predict.ladder import climb, ladder
from ceiling.predict.opspec import (
    AttentionShape,
    GdnShape,
    GemmShape,
    MlaShape,
    MoeShape,
    OpSpec,
    OpTime,
)
from ceiling.predict.resolved import Setup
from ceiling.spec.profile import OpFit

if TYPE_CHECKING:
    pass


@dataclass
class _Row:
    """A table's latency for one op (us, before the clock scaling), and what it is."""

    us: float
    exact: bool
    note: str
    chosen: bool = False  # the rows of a backend the user named (not checked against the prior)
    key: str = ""  # the table it was read from


def family_for(op: OpSpec, arch_class: str) -> str:
    """The kernel family an op runs in (kernels.yaml `formats` rules)."""
    if op.kind in ("attention",):
        return "attn_gqa"
    if op.kind == "mla":
        return "attn_mla"
    if op.kind == "gdn":
        return "attn_gdn"
    table = kernels().formats["moe" if op.kind == "moe" else "gemm"]
    for prefix, rule in table.items():
        if op.fmt.startswith(prefix):
            return rule.get(arch_class) or rule["default"]
    return "moe_bf16" if op.kind == "moe" else "gemm_bf16"


def prior(family: str, arch_class: str) -> tuple[KernelPrior, float, str]:
    """(prior record, confidence, note) for a family on a GPU class, borrowing if needed."""
    pri, lad = kernel_priors().classes, ladder()
    conf = lad.confidence.prior
    rec = pri.get(arch_class, {}).get(family)
    if rec is not None:
        if rec.eff is None:  # fixed cost known, bandwidth borrowed
            for other in lad.borrow.get(arch_class, []):
                lent = pri.get(other, {}).get(family)
                if lent is not None and lent.eff:
                    rec = rec.model_copy(update={"eff": lent.eff})
                    break
        return rec, conf.own_class, ""
    for other in lad.borrow.get(arch_class, []):
        rec = pri.get(other, {}).get(family)
        if rec is not None:
            return rec, conf.borrowed_class, f"no {arch_class} data for {family}: {other} prior"
    fb = lad.fallback
    return (
        KernelPrior(t0_us=fb.t0_us, eff=fb.eff),
        conf.generic,
        f"no prior for {family}: generic {fb.t0_us:g} us + {fb.eff * 100:.0f} % BW",
    )


def _tokens(op: OpSpec, kind: _Kind) -> tuple[float, int, float]:
    """Tokens (or sequences), hidden size (MoE) and streamed bytes of a kernel op."""
    sh = op.shape
    if kind == "gemm":
        assert isinstance(sh, GemmShape)  # ops.build_ops gives every GEMM its shape
        return float(sh.m), 0, op.weight_bytes
    if kind == "moe":
        assert isinstance(sh, MoeShape)
        return float(sh.tokens), int(sh.hidden), op.weight_bytes
    # attention, MLA and GDN ops carry one of these (ops.build_ops)
    assert isinstance(sh, AttentionShape | MlaShape | GdnShape)
    return float(sh.batch), 0, op.kv_bytes


class Evidence(TableReads):
    """Resolves op timings for one prediction setup (``predict.step.Setup``)."""

    def __init__(self, s: Setup, anchors: dict[str, OpSpec] | None = None) -> None:
        """``anchors``: each op of the step at one sequence, by name (``decode_step``): a
        table is judged against the prior there, once for every batch (see ``_kernel``)."""
        self.s = s
        self.anchors = anchors or {}
        self.gpu = s.gpu
        self.cls = s.gpu.arch_class
        self.engine = s.dep.engine
        self.consts = s.consts
        self.bw_ds = float(s.gpu.mem_bw_GBps)
        self.cold = s.consts.table_cold_us
        self.clock = s.gpu.clock_scale
        self.system = s.gpu.aic_system if self.engine in ("vllm", "sglang", "trtllm") else None
        from ceiling.predict import tables

        self.tables = tables if (self.system and tables.info() is not None) else None
        self.profile = s.profile
        self.generic = self.engine == "generic"
        self.conf = ladder().confidence
        self.eff_default = ladder().fallback.eff  # a prior without a bandwidth figure
        self._ratios: dict[tuple[str, str, str, _Skip], float] = {}  # _proxy_ratio, per op

    # -------------------------------------------------------------------------- helpers
    def bound_bw(self) -> float:
        """Bandwidth the bound reads at (GB/s): the best of datasheet x fraction and measured."""
        frac = self.consts.bound_bw_fraction
        best = self.bw_ds * frac
        if self.gpu.measured_bw_GBps:
            best = max(best, self.gpu.measured_bw_GBps)
        p = self.profile
        if p is not None:
            for v in [p.mem_bw_GBps, p.copy_bw_GBps, *(p.gemv_bw_GBps or {}).values()]:
                if v:
                    best = max(best, float(v))
        return best

    def peak_flops(self, compute: str) -> float:
        return self.gpu.peak_tflops(compute) * 1e12

    def _bound(self, op: OpSpec, fixed: bool) -> float:
        mem = (op.weight_bytes + op.kv_bytes + op.act_bytes) / (self.bound_bw() * 1e3)
        cmp = op.flops / self.peak_flops(op.compute) * 1e6 if op.flops else 0.0
        floor = self.consts.bound_op_us if fixed else 0.0
        return max(mem, cmp) + floor

    def _profile_fit(self, family: str) -> OpFit | None:
        p = self.profile
        if p is None:
            return None
        for f in p.ops:
            if f.family == family and (f.engine_kernel or self.generic):
                return f
        if family == "gemm_bf16" and p.gemm_fixed_us_graph and (p.gemv_bw_GBps or {}).get("bf16"):
            return OpFit(
                family=family,
                t0_us=p.gemm_fixed_us_graph,
                bw_GBps=p.gemv_bw_GBps["bf16"],
                note="calibrate's bf16 GEMV fit",
            )
        return None

    def _compute_floor(self, op: OpSpec) -> float:
        """Compute-bound time (us) at the dense peak x compute_efficiency."""
        if not op.flops:
            return 0.0
        eff = self.consts.compute_efficiency
        return op.flops / (self.peak_flops(op.compute) * eff) * 1e6

    # -------------------------------------------------------------------------- ops
    def time(self, op: OpSpec) -> OpTime:
        if op.kind == "comm":
            from ceiling.predict.comm import comm_time

            return comm_time(self.s, op)
        if op.kind == "host":
            from ceiling.predict.choices import host_cost

            ms, why = host_cost(self.s)
            eng = self.conf.engine
            conf = eng.measured if "PR #" in why else eng.estimate
            return OpTime(ms * 1e3, 0.0, "engine", conf, "host", why)
        if self.generic and not self._measured_here(op):
            return self._generic(op)
        if op.kind in ("elementwise", "sampling"):
            return self._elementwise(op)
        family = family_for(op, self.cls)
        if op.kind == "gemm":
            return self._kernel(op, family, "gemm")
        if op.kind == "moe":
            return self._kernel(op, family, "moe")
        return self._kernel(op, family, "attention")

    def _measured_here(self, op: OpSpec) -> bool:
        """Whether the profile measured this op's kernel family on this box: then even plain
        PyTorch (engine `generic`) takes the measurement over its priors (calibrate --ops times
        PyTorch's own kernels: cuBLAS, SDPA, torch._grouped_mm, rms_norm)."""
        if self.profile is None or op.kind not in (
            "gemm",
            "moe",
            "attention",
            "mla",
            "elementwise",
        ):
            return False
        family = "elementwise" if op.kind == "elementwise" else family_for(op, self.cls)
        return any(f.family == family for f in self.profile.ops)

    def _elementwise(self, op: OpSpec) -> OpTime:
        """An elementwise op up the evidence ladder: its kernels' fixed cost from the profile's
        elementwise fit, else from the profile's launch figure, else the prior; its activation
        bytes stream at ``elementwise_bw_fraction`` of the datasheet bandwidth."""
        consts, conf = self.consts, self.conf
        bound = self._bound(op, fixed=False)

        def timed(t0: float, src: str, c: float) -> OpTime:
            stream = op.act_bytes / (consts.elementwise_bw_fraction * self.bw_ds * 1e3)
            return OpTime(op.kernels * t0 / self.clock + stream, bound, src, c, "elementwise")

        def from_profile() -> OpTime | None:
            fit = self._profile_fit("elementwise")
            if fit is not None:
                return timed(fit.t0_us, "profile", conf.profile.elementwise)
            p = self.profile
            if p is not None and p.kernel_launch_us_graph:
                t0 = p.kernel_launch_us_graph + consts.elementwise_launch_extra_us
                return timed(t0, "profile", conf.profile.launch_figure)
            return None

        def from_prior() -> OpTime:
            return timed(consts.elementwise_us, "prior", conf.prior.elementwise)

        return climb({"profile": from_profile, "prior": from_prior})

    def _generic(self, op: OpSpec) -> OpTime:
        """Plain PyTorch (engine `generic`): cuBLAS GEMVs and unfused kernels, measured on an
        H200 (experiments/validation/predict_kernel_cost.py; constants.yaml)."""
        s = self.s
        bw = s.bw_GBps
        if op.kind in ("gemm", "moe"):
            us = s.gemm_kernel_us + op.weight_bytes / (bw * 1e3)
            if op.kind == "moe":
                us += (op.kernels - 1) * s.small_kernel_us
        else:
            us = op.kernels * s.small_kernel_us + (op.kv_bytes + op.act_bytes) / (bw * 1e3)
        us = max(us, self._compute_floor(op))
        conf = self.conf.prior.pytorch
        return OpTime(us, self._bound(op, op.kind != "elementwise"), "prior", conf, "pytorch")

    def _prior_us(self, rec: KernelPrior, op: OpSpec, tokens: float, hidden: int = 0) -> float:
        t0 = rec.t0_us
        t0 += rec.t0_per_khidden_us * hidden / 1000
        eff = rec.eff or self.eff_default
        if tokens > 1 and rec.eff_64:
            # between 1 and 64 tokens: log-interpolate the fits at 1 and 64 (beyond: the 64 fit)
            w = min(math.log(tokens) / math.log(64), 1.0)
            eff = eff + w * (rec.eff_64 - eff)
            t0_64 = rec.t0_64_us if rec.t0_64_us is not None else t0
            t0 = t0 + w * max(t0_64 - rec.t0_us, 0.0)
        else:
            t0 += rec.t0_per_token_us * max(min(tokens, 64) - 1, 0)
        nbytes = op.weight_bytes + op.kv_bytes
        return (t0 + self.cold) / self.clock + nbytes / (eff * self.bw_ds * 1e3)

    def _stream_floor(self, rec: KernelPrior, op: OpSpec, tokens: float) -> float:
        """A table row timed in a loop keeps small weights/KV in L2; a decode step streams them
        from DRAM: never below the bytes at the family's streamed efficiency (the prior's).

        At ``tokens`` that efficiency is the prior's there (never below its one-token figure),
        but at most ``tokens`` times the one-token figure: sequences side by side can at best
        overlap whole. The one-token figure alone floored a kernel that walks each sequence's
        context serially as if it ran the sequences one after another: the A100's TensorRT-LLM
        MLA decode (0.3 % of the datasheet bandwidth at one sequence, 125 us for 1.2 MB) put
        DeepSeek-V3.1 NVFP4 on the A100 at 49 ms per MLA layer at 256 sequences, where the
        table reads 0.48 ms. Capped, the floor never falls as the batch grows."""
        eff = eff1 = rec.eff or self.eff_default
        if tokens > 1 and rec.eff_64:
            w = min(math.log(tokens) / math.log(64), 1.0)
            eff = min(max(eff1, eff1 + w * (rec.eff_64 - eff1)), tokens * eff1)
        return self.cold + (op.weight_bytes + op.kv_bytes) / (eff * self.bw_ds * 1e3)

    def _proxy(
        self, us: float, op: OpSpec, rec: KernelPrior, kind: _Kind, family: str, skip: _Skip
    ) -> float:
        """A table measured on another GPU of the class (the catalog's ``aic_system``: the L40S
        for an RTX 4090, the A100 80GB SXM for an A100 40GB, the H100 SXM for an H100 PCIe):
        its streamed bytes move at this GPU's bandwidth instead (datasheet ratio, at the
        family's streamed efficiency); the rest of the latency is kept.

        The correction is settled once, at one sequence (the op's anchor, as the table check is
        in ``_judge``), and applied as a ratio to the row at every batch: the table's time
        scaled by a constant never falls where the table does not. Taken at each batch as a
        difference of the op's bytes, it fell wherever the table's envelope is flat and the bytes
        still grow (the H100 SXM's MoE table read for gpt-oss-120b on the H20: 687.03 -> 687.08
        us at 32 -> 33 tokens while the experts read grew, so the step fell)."""
        return us * self._proxy_ratio(us, op, rec, kind, family, skip)

    def _proxy_ratio(
        self, us: float, op: OpSpec, rec: KernelPrior, kind: _Kind, family: str, skip: _Skip
    ) -> float:
        """(table row at one sequence + the bandwidth correction of its bytes) / that row."""
        sys_bw = self._system_bw()
        if not sys_bw or abs(sys_bw / self.bw_ds - 1) < 0.03:
            return 1.0
        key = (op.name, kind, family, skip)
        if key in self._ratios:
            return self._ratios[key]
        at, us1 = op, us
        anchor = self.anchors.get(op.name)
        if anchor is not None and anchor is not op and anchor.kind == op.kind:
            meas = self._measure(kind, anchor, family, _tokens(anchor, kind)[0], skip)[0]
            if meas is not None and meas.us > 0:
                at, us1 = anchor, meas.us
        if us1 <= 0:
            return 1.0
        eff = rec.eff or self.eff_default
        delta = (at.weight_bytes + at.kv_bytes) / eff * (1 / self.bw_ds - 1 / sys_bw) / 1e3
        ratio = max(us1 + delta, 0.0) / us1
        if at is not op:  # settled at the anchor: the same for every batch of this step
            self._ratios[key] = ratio
        return ratio

    def _system_bw(self) -> float | None:
        if not hasattr(self, "_sys_bw"):
            self._sys_bw = self.tables.system_bw_GBps(self.system) if self.tables else None
        return self._sys_bw

    def _check(self, table_us: float, prior_us: float) -> str:
        chk = ladder().table_check
        if table_us > chk.max_ratio * prior_us and table_us - prior_us > chk.min_excess_us:
            return (
                f"table row {table_us:.0f} us is over {chk.max_ratio:g}x the prior {prior_us:.0f} us for this "
                "family (warm-up/JIT in the measurement or a kernel not used at decode): skipped"
            )
        return ""

    def _judge(
        self,
        op: OpSpec,
        family: str,
        kind: _Kind,
        rec: KernelPrior,
        row: _Row,
        prior_us: float,
        skip: _Skip,
    ) -> tuple[str, str]:
        """Whether the table is evidence for this op: judged at one sequence (the op's anchor),
        once for the whole batch curve; (why not, the table judged). Judged at each batch, a
        table that runs near the check's ratio flips to the prior at some batch and the step
        falls as the batch grows (DeepSeek-V3.1 NVFP4 on the H200: 59.8 ms at 18 sequences,
        27.3 at 19)."""
        anchor = self.anchors.get(op.name)
        if anchor is None or anchor is op or anchor.kind != op.kind:
            return self._check(row.us, prior_us), row.key
        look = {"gemm": self._gemm_row, "moe": self._moe_row, "attention": self._attn_row}
        t1, h1, _ = _tokens(anchor, kind)
        row1, _note = look[kind](anchor, family, rec, t1, skip)
        if row1 is None:  # no row at one sequence: the row at hand is all there is
            return self._check(row.us, prior_us), row.key
        bad = self._check(row1.us, self._prior_us(rec, anchor, t1, h1))
        return (f"{bad} (judged at one sequence, for every batch)" if bad else ""), row1.key

    def _finish(
        self, op: OpSpec, us: float, src: str, conf: float, family: str, note: str
    ) -> OpTime:
        us = max(us, self._compute_floor(op))
        bound = self._bound(op, fixed=True)
        # physics: no measurement of a streamed op beats the bound
        us = max(us, bound)
        return OpTime(us, bound, src, conf, family, note)

    # -------------------------------------------------------------------------- the ladder
    def _kernel(self, op: OpSpec, family: str, kind: _Kind) -> OpTime:
        """A GEMM, MoE or attention op up the evidence ladder (``predict.ladder``)."""
        tokens, hidden, streamed = _tokens(op, kind)
        conf = ladder().confidence
        rec, pconf, pnote = prior(family, self.cls)
        prior_us = self._prior_us(rec, op, tokens, hidden)
        note = pnote

        def from_profile() -> OpTime | None:
            fit = self._profile_fit(family)
            if fit is None:
                return None
            bw = fit.bw_GBps or (rec.eff or self.eff_default) * self.bw_ds
            us = fit.t0_us / self.clock + streamed / (bw * 1e3)
            return self._finish(op, us, "profile", conf.profile.kernel, family, fit.note)

        def from_table() -> OpTime | None:
            """The first candidate table (``tables.lookup._candidates``: the engine's own, then
            other engines' of the same format) that passes the check; a table refused by the
            check is not evidence of the format, so the next candidate is tried before the
            prior (vLLM's DeepGEMM block-128 table on the B200 holds its JIT: 175-273 us at
            every shape; vLLM's CUTLASS block-128 and the other engines' DeepGEMM tables
            measure the same format)."""
            nonlocal note
            if self.tables is None:
                return None
            look = {"gemm": self._gemm_row, "moe": self._moe_row, "attention": self._attn_row}
            skip: _Skip = ()
            refused: list[str] = []
            base = note
            while True:
                row, extra = look[kind](op, family, rec, tokens, skip)
                note = "; ".join(x for x in (base, extra) if x)
                if row is None:
                    if refused:
                        note = "; ".join(refused)
                    return None
                # a backend the user named is the kernel that runs: its rows are not checked
                # against the default kernels' prior (SGLang Triton decode at 128k is ~30x it)
                bad, judged = (
                    ("", row.key)
                    if row.chosen
                    else self._judge(op, family, kind, rec, row, prior_us, skip)
                )
                if not bad:
                    break
                refused.append(f"{judged}: {bad}")
                if row.key in skip and judged in skip:  # nothing new to leave out
                    note = "; ".join(refused)
                    return None
                skip = (*skip, *dict.fromkeys(k for k in (row.key, judged) if k not in skip))
            c = getattr(conf.table, kind).of(row.exact)
            if skip:  # the check refused the candidates before this one
                row.note += f"; the next candidate table: {', '.join(skip)} refused by the check"
            return self._finish(op, row.us / self.clock, "table", c, family, row.note)

        def from_prior() -> OpTime:
            return self._finish(op, prior_us, "prior", pconf, family, note)

        return climb({"profile": from_profile, "table": from_table, "prior": from_prior})

    def _gemm_row(
        self, op: OpSpec, family: str, rec: KernelPrior, m: float, skip: _Skip = ()
    ) -> tuple[_Row | None, str]:
        meas, _, _ = self._gemm_meas(op, family, m, skip)
        if meas is None:
            return None, ""
        floor = self._stream_floor(rec, op, m)
        us = max(self._proxy(meas.us, op, rec, "gemm", family, skip) + self.cold, floor)
        why = "; ".join(x for x in (meas.key, meas.note) if x)
        return _Row(us, meas.exact, why, key=meas.key), ""

    def _moe_row(
        self, op: OpSpec, family: str, rec: KernelPrior, tokens: float, skip: _Skip = ()
    ) -> tuple[_Row | None, str]:
        sh = op.shape
        assert isinstance(sh, MoeShape)
        meas, bnote, _ = self._moe_meas(op, family, tokens, skip)
        if meas is None:
            return None, bnote
        us = self._proxy(meas.us, op, rec, "moe", family, skip) + self.cold
        if int(sh.ep) > 1:
            # the table holds EP=1 rows: swap its expert bytes (top-k experts of every
            # token) for the busiest EP rank's, at the prior's bandwidth
            eff = (rec.eff or self.eff_default) * self.bw_ds * 1e3
            table_bytes = sh.expert_bytes * min(sh.experts, tokens * sh.topk)
            us += (op.weight_bytes - table_bytes) / eff
        us = max(us, self._stream_floor(rec, op, tokens))
        why = meas.key + (f"; {meas.note}" if meas.note else "")
        return _Row(us, meas.exact, why, key=meas.key), bnote

    def _attn_row(
        self, op: OpSpec, family: str, rec: KernelPrior, batch: float, skip: _Skip = ()
    ) -> tuple[_Row | None, str]:
        meas, bnote, chosen = self._attn_meas(op, family, batch, skip)
        if meas is None:
            return None, bnote
        floor = self._stream_floor(rec, op, batch)
        us = max(self._proxy(meas.us, op, rec, "attention", family, skip) + self.cold, floor)
        why = "; ".join(x for x in (meas.key, meas.note, bnote) if x)
        return _Row(us, meas.exact, why, chosen, key=meas.key), bnote
