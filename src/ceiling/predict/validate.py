"""What cannot exist is refused, not predicted: impossible combinations and physical values.

``predict`` answered every request with a number, also for setups that cannot run: TensorRT-LLM
on an AMD GPU, NVLink between GPUs that have none, ``--link`` on one GPU (silently replaced by
the GPU's default), ``--mem-clock 1e308``, a GPU file with a 10^9 GB/s memory. Each is now one
``CeilingError`` (the CLI prints ``error:`` + ``fix:`` and exits 2) before any work is done.

The limits are data (``data/predict/validity.yaml``: vendors per architecture, engines per
vendor, physical ranges with the reason for each); this module only applies them:

- :func:`check_request`: the user's own request (``api.predict``), with the rules that a
  what-if may break on purpose (NVLink on a PCIe-only GPU is the hypothetical "NVLink instead"
  row) and the ranges of every number;
- :func:`check_engine_vendor`: the engine runs on this vendor's GPUs (in ``core.setup``, so a
  what-if "other engine" row that cannot run is listed as such);
- :func:`check_gpu`: a GPU's fields within what any hardware has (catalog or ``--gpu FILE``);
- :func:`vendor_of` and :func:`reword`: the vendor's words in what predict prints (RCCL, HIP
  graphs and xGMI on ROCm, never NCCL, CUDA graphs or NVLink).
"""

from __future__ import annotations

import math
import re
from typing import get_args

from ceiling.errors import CeilingError
from ceiling.predict.schema import Prediction, PredictRequest
from ceiling.spec._data import load_yaml
from ceiling.spec.checks import Rule, Stack, Validity
from ceiling.spec.deployment import engines_table
from ceiling.spec.hardware import GPU, Link, load_gpu, load_link
from ceiling.spec.model import ModelSpec

_NO_LINK = ("self", "none", "")


def _data() -> Validity:
    return load_yaml("predict/validity.yaml", schema=Validity)


def vendor_of(gpu: GPU) -> str:
    """``nvidia`` or ``amd``, by the GPU's architecture class (nvidia when unknown: sm > 0)."""
    return _data().vendors.get(gpu.arch, "nvidia" if gpu.sm else "unknown")


def check_engine_vendor(engine: str, gpu: GPU) -> None:
    """The engine runs on this GPU's vendor (TensorRT-LLM: NVIDIA only)."""
    vendor = vendor_of(gpu)
    allowed = _data().engine_vendors.get(engine)
    if allowed is not None and vendor not in allowed:
        known = get_args(PredictRequest.model_fields["engine"].annotation)
        ok = [
            e
            for e, vs in _data().engine_vendors.items()
            if vendor in vs and e != "generic" and e in known
        ]
        raise CeilingError(
            f"--engine {engine} does not run on {gpu.name} ({vendor.upper()} {gpu.arch}): "
            f"{engine} runs on {' and '.join(v.upper() for v in allowed)} GPUs only",
            fix=f"use --engine {' or '.join(ok)} on {gpu.name}",
        )


def check_dcp(engine: str, dcp: int, tp: int, spec: ModelSpec) -> None:
    """``--dcp N`` is a layout the engine runs: an engine with decode context parallel
    (``engines.yaml`` ``decode_context_parallel``), N dividing TP (the DCP group reuses the TP
    ranks: vLLM's ParallelConfig check), attention of a kind the rule shards (MLA; GQA with
    vLLM's ModelConfig limits: TP above the KV heads, dcp <= TP / KV heads, query heads per
    KV head divisible by dcp)."""
    if dcp <= 1:
        return
    rule = engines_table()[engine].decode_context_parallel if engine in engines_table() else None
    if rule is None:
        have = [e for e, r in engines_table().items() if r.decode_context_parallel]
        raise CeilingError(
            f"--dcp {dcp}: {engine} has no decode context parallel",
            fix=f"use --engine {' or '.join(have)}, or drop --dcp",
        )
    if tp % dcp:
        raise CeilingError(
            f"--dcp {dcp} must divide --tp {tp}: the DCP group reuses the TP ranks",
            fix=f"use a --dcp that divides {tp} (e.g. --dcp {tp})",
        )
    kinds = {
        "gqa" if layer.attention not in ("mla", "linear") else layer.attention
        for layer in spec.layers
    }
    if not kinds & set(rule.attention):
        raise CeilingError(
            f"--dcp {dcp}: {spec.name} has no {'/'.join(a.upper() for a in rule.attention)} "
            "attention, the kinds DCP shards",
            fix="drop --dcp",
        )
    if "mla" not in kinds:
        # vLLM config/model.py: GQA/MQA DCP shards the replicas of a KV head over the TP ranks
        kv = max(
            (layer.kv_heads for layer in spec.layers if layer.attention != "linear"), default=1
        )
        if tp <= kv:
            raise CeilingError(
                f"--dcp {dcp}: GQA decode context parallel needs --tp above the model's {kv} "
                f"KV heads (--tp {tp}: no KV head is replicated)",
                fix=f"use --tp {2 * kv} or more, or drop --dcp",
            )
        if dcp > tp // kv:
            raise CeilingError(
                f"--dcp {dcp} exceeds tp / KV heads = {tp // kv} for {spec.name}",
                fix=f"use --dcp {tp // kv} or less",
            )
        if (spec.heads // kv) % dcp:
            raise CeilingError(
                f"--dcp {dcp} must divide the {spec.heads // kv} query heads per KV head",
                fix="use a --dcp that divides them",
            )


def max_dcp(engine: str, tp: int, spec: ModelSpec) -> int:
    """The largest DCP size :func:`check_dcp` accepts for this layout (1: none)."""
    for dcp in range(tp, 1, -1):
        if tp % dcp:
            continue
        try:
            check_dcp(engine, dcp, tp, spec)
        except CeilingError:
            continue
        return dcp
    return 1


def _finite(name: str, value: float | None) -> None:
    if value is not None and not math.isfinite(value):
        raise CeilingError(f"{name} is {value!r}: not a finite number", fix=f"pass a real {name}")


def check_gpu(gpu: GPU) -> None:
    """Every number of a GPU entry is finite, positive and within what any hardware has."""
    ranges = _data().gpu
    where = f"GPU {gpu.name}" + (f" ({gpu.source})" if gpu.source.startswith("user") else "")
    for field, rng in ranges.items():
        raw = getattr(gpu, field)
        values = raw.items() if isinstance(raw, dict) else [(None, raw)]
        for key, value in values:
            label = f"{field}.{key}" if key else field
            if value is None:
                continue
            if not math.isfinite(value) or value <= 0 or value > rng.max:
                raise CeilingError(
                    f"{where}: {label} = {value!r} is outside what any GPU has "
                    f"(0 < {label} <= {rng.max:g}: {rng.why})",
                    fix=f"give {label} from the GPU's datasheet",
                )


def _range(name: str, value: float, rule: Rule, unit: str = "") -> None:
    lo = -math.inf if rule.min is None else rule.min
    if not lo <= value <= rule.max:
        bounds = f"{lo:g}-{rule.max:g}" if rule.min is not None else f"at most {rule.max:g}"
        raise CeilingError(
            f"{name} {value:g}{unit} is physically impossible here ({bounds}: {rule.why})",
            fix=f"pass a real {name} (see `ceiling predict --help`)",
        )


def check_request(req: PredictRequest) -> None:
    """The user's request describes hardware and a layout that exist (a CPU request only gets
    the number checks)."""
    rules = _data().request
    _finite("--mem-clock", req.mem_clock)
    _finite("--power-limit", req.power_limit)
    _range("--context", req.context, rules["context"])
    _range("--prompt-len", req.prompt_len, rules["prompt_len"])
    _range("--batch", req.batch, rules["batch"])
    _range("tp x pp", req.tp * req.pp, rules["replica_gpus"], " GPUs")
    if req.gpus is not None:
        _range("--gpus", req.gpus, rules["gpus"])
    if req.hardware is not None and req.hardware.kind == "cpu":
        return
    gpu = load_gpu(req.gpu_name())
    check_gpu(gpu)
    if req.mem_clock is not None and gpu.mem_clock_MHz:
        ratio = req.mem_clock / gpu.mem_clock_MHz
        rule = rules["mem_clock_ratio"]
        if not (rule.min or 0.0) <= ratio <= rule.max:
            raise CeilingError(
                f"--mem-clock {req.mem_clock:g} MHz is {ratio:.3g}x {gpu.name}'s "
                f"{gpu.mem_clock_MHz:g} MHz memory clock ({rule.why})",
                fix=f"pass the clock nvidia-smi reports under load, {(rule.min or 0) * gpu.mem_clock_MHz:.0f}"
                f"-{rule.max * gpu.mem_clock_MHz:.0f} MHz on {gpu.name}",
            )
    if req.power_limit is not None and gpu.tdp_W:
        ratio = req.power_limit / gpu.tdp_W
        rule = rules["power_limit_ratio"]
        if not (rule.min or 0.0) <= ratio <= rule.max:
            raise CeilingError(
                f"--power-limit {req.power_limit:g} W is {ratio:.3g}x {gpu.name}'s "
                f"{gpu.tdp_W:g} W board power ({rule.why})",
                fix=f"pass a cap of {(rule.min or 0) * gpu.tdp_W:.0f}-{rule.max * gpu.tdp_W:.0f} W",
            )
    check_engine_vendor(req.engine, gpu)
    if req.link and req.link.strip().lower() not in _NO_LINK:
        _check_link(req, gpu, load_link(req.link))


def _check_link(req: PredictRequest, gpu: GPU, link: Link) -> None:
    """An explicit ``--link``: used at all, and one this GPU can have."""
    world = req.tp * req.pp
    dp = req.dp or ((req.gpus or world) // world)
    if world == 1 and not (req.ep > 1 and dp > 1):
        raise CeilingError(
            f"--link {link.name} with one GPU per replica (tp x pp = 1): the link carries "
            "nothing, and predict would silently ignore it",
            fix="drop --link, or split the model over GPUs (--tp N) so that they talk",
        )
    if link.kind == "nvlink":
        own = gpu.nvlink
        family = link.name.removesuffix("-nop2p")
        if own is None or family != own:
            has = f"its link is {own}" if own else "it has no NVLink (PCIe only)"
            word = "xGMI" if link.name.startswith("xgmi") else "NVLink"
            raise CeilingError(
                f"--link {link.name} on {gpu.name}: {word} of that kind does not exist on "
                f"this GPU ({has})",
                fix=f"use --link {own or _pcie_default(gpu)} (see `ceiling predict --list-links`)",
            )
        if own.endswith("-bridge") and world > 2:
            raise CeilingError(
                f"--link {link.name} joins two GPUs; tp x pp = {world} spans more than a pair",
                fix=f"use --link {_pcie_default(gpu)} for {world} GPUs, or --tp 2",
            )
    m = re.match(r"pcie(\d)", link.name)
    if m and int(m.group(1)) > gpu.pcie_gen:
        raise CeilingError(
            f"--link {link.name} on {gpu.name}: the GPU is PCIe Gen{gpu.pcie_gen}, so the link "
            f"runs at Gen{gpu.pcie_gen} at most",
            fix=f"use a pcie{gpu.pcie_gen}-* link (see `ceiling predict --list-links`)",
        )


def _pcie_default(gpu: GPU) -> str:
    gen = gpu.pcie_gen if gpu.pcie_gen in (3, 4, 5) else 4
    return f"pcie{gen}-switch" + ("" if gpu.p2p_supported else "-nop2p")


def words(gpu: GPU) -> dict[str, str]:
    """The vendor's words for the mechanisms predict names (``data/predict/validity.yaml``)."""
    return _data().words.get(vendor_of(gpu)) or {}


def reword(text: str, table: dict[str, str]) -> str:
    """``text`` in the vendor's words (longest phrase first: 'CUDA graphs' before 'CUDA graph')."""
    for src in sorted(table, key=len, reverse=True):
        text = text.replace(src, table[src])
    return text


def collectives(gpu: GPU) -> Stack:
    """The collective library and custom allreduce of this GPU's software stack."""
    stacks = _data().collectives
    return stacks.get(vendor_of(gpu), stacks["nvidia"])


def in_vendor_words(pred: Prediction, gpu: GPU) -> None:
    """Say ``pred`` in the GPU vendor's words, in place: every text a person
    reads (assumptions, component kinds, what-if rows, op notes); on ROCm one assumption names
    the collective stack. Numbers and keys are untouched."""
    table = words(gpu)
    if not table:
        return
    stack = collectives(gpu)
    pred.assumptions = [reword(a, table) for a in pred.assumptions] + [
        f"collectives on ROCm: {stack.library}; {stack.custom_allreduce.strip()}"
    ]
    pred.component_kind = {k: reword(v, table) for k, v in pred.component_kind.items()}
    for w in pred.what_if or []:
        w.change, w.moved, w.note = (reword(t, table) for t in (w.change, w.moved, w.note))
    for block in (pred.expected, pred.bound):
        for op in block.ops if block is not None else []:
            op.note = reword(op.note, table)
