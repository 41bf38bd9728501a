"""aiconfigurator-core's measured end-to-end records (``systems/silicon_sample.csv``).

The package ships, beside its per-kernel tables, end-to-end serving measurements of its own
("silicon"): a model served by vLLM, SGLang or TensorRT-LLM on a GPU system at one concurrency,
with the layout (TP, PP, attention DP, MoE TP/EP), the formats, the input/output lengths and the
measured TPOT. predict never fits anything to them: they are the batch curve's validation rows
(``validation.batch_validation``). This module only reads them (the one adapter to the
package's files is ``ceiling.predict.tables``).
"""

from __future__ import annotations

import csv
from functools import cache
from importlib import util
from pathlib import Path

from pydantic import BaseModel


class SiliconRecord(BaseModel):
    """One measured aggregated-serving point."""

    id: str
    source: str
    backend: str
    backend_version: str
    model_path: str
    system: str
    gemm_quant_mode: str
    moe_quant_mode: str
    isl: int
    osl: int
    concurrency: int
    tp: int
    pp: int
    attention_dp: int
    moe_tp: int
    moe_ep: int
    tpot_ms: float


def _path() -> Path | None:
    spec = util.find_spec("aiconfigurator_core")
    if spec is None or not spec.submodule_search_locations:
        return None
    p = Path(next(iter(spec.submodule_search_locations))) / "systems" / "silicon_sample.csv"
    return p if p.is_file() else None


def _int(text: str, default: int = 1) -> int:
    try:
        return int(float(text))
    except ValueError:
        return default


@cache
def silicon_records() -> tuple[SiliconRecord, ...]:
    """Every aggregated-serving record with a measured TPOT (empty without the package)."""
    path = _path()
    if path is None:
        return ()
    out = []
    with path.open(newline="") as fh:
        for r in csv.DictReader(fh):
            if r.get("mode") != "agg" or not r.get("silicon_tpot_ms"):
                continue
            out.append(
                SiliconRecord(
                    id=r["id"],
                    source=r["silicon_data_source"],
                    backend=r["backend"],
                    backend_version=r["backend_version"],
                    model_path=r["model_path"],
                    system=r["system"],
                    gemm_quant_mode=r["gemm_quant_mode"],
                    moe_quant_mode=r["moe_quant_mode"],
                    isl=_int(r["isl"]),
                    osl=_int(r["osl"]),
                    concurrency=_int(r["batch_size"]),
                    tp=_int(r["tp_size"]),
                    pp=_int(r["pp_size"]),
                    attention_dp=max(1, _int(r["attention_dp_size"])),
                    moe_tp=_int(r["moe_tp_size"]),
                    moe_ep=_int(r["moe_ep_size"]),
                    tpot_ms=float(r["silicon_tpot_ms"]),
                )
            )
    return tuple(out)
