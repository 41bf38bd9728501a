"""The sanity gate on a real vLLM (CPU build): the intact tiny model passes; the same weights
served wrongly are broken, and neither doctor nor sweep benchmarks them.

The faulty copies come from src/ceiling/demo/tiny_faults.py: a norm epsilon of 1e-2 instead of
1e-5 in the served config, layer 0's V heads swapped (two tensor-parallel shards of one
projection loaded in the wrong order), and a sibling model's tokenizer. Each is started exactly
once (vLLM's start-up is 40-100 s on the 2-core test machine): the first by ``doctor
--variant``, the other two as the two variants of one sweep.
"""

from __future__ import annotations

import json
import sys

import pytest

from ceiling.engines.variant import load_variant
from ceiling.flows.doctor import DoctorConfig
from ceiling.flows.doctor import run as run_doctor
from ceiling.sanity.checks import check_server
from ceiling.sanity.gate import SanityBroken

pytestmark = pytest.mark.engine


def _variant_file(tmp_path, cpu_tiny_variant, model, name):
    """A variant file like cpu-tiny.yaml, serving ``model``."""
    import yaml

    data = {
        "engine": "vllm",
        "model": str(model),
        "served_model_name": "tiny",
        "host": "127.0.0.1",
        "log_dir": str(tmp_path / "logs"),
        "args": {
            a.flag.lstrip("-"): (a.values[0] if a.values else True) for a in cpu_tiny_variant.args
        },
        "env": dict(cpu_tiny_variant.env),
    }
    path = tmp_path / f"{name}.yaml"
    path.write_text(yaml.safe_dump(data))
    return path


def test_intact_model_passes_and_the_reference_agrees(vllm_server, tiny_model_dir):
    report = check_server(vllm_server.url, "tiny", "vllm", str(tiny_model_dir), "float32")
    print(f"sanity on the intact model: {report.seconds:.2f} s", file=sys.stderr)
    assert report.verdict == "ok", report.headline
    status = {c.name: c.status for c in report.checks}
    assert set(status.values()) == {"ok"}, status
    assert report.family == "ceiling-tiny"
    assert report.perplexity is not None and report.perplexity < 1.3
    # the CPU reference (numpy, same weights) and vLLM compute the same log-probabilities
    ref = report.check("reference")
    assert ref.value is not None and ref.value < 1e-3
    assert "top-1 token agrees at 100% of positions" in ref.summary


def test_doctor_stops_on_a_misread_norm_epsilon(
    cpu_tiny_variant, tiny_faults, tiny_model_dir, tmp_path
):
    variant = _variant_file(tmp_path, cpu_tiny_variant, tiny_faults["norm-eps"], "norm-eps")
    out = tmp_path / "doctor"
    with pytest.raises(SanityBroken) as err:
        run_doctor(
            DoctorConfig(
                variant=str(variant),
                # the checkpoint as published: the reference pass computes with its config
                model_path=str(tiny_model_dir),
                out_dir=str(out),
                progress=False,
                telemetry=False,
                measure_cpu=False,
            )
        )
    rep = err.value.report
    print(f"sanity on norm-eps: {rep.seconds:.2f} s", file=sys.stderr)
    status = {c.name: c.status for c in rep.checks}
    assert status["known answers"] == "broken" and status["perplexity"] == "broken"
    # the served copy computes with eps 1e-2, the checkpoint's config says 1e-5: whole nats apart
    assert status["reference"] == "broken" and rep.check("reference").value > 0.5
    doc = json.loads((out / "doctor.json").read_text())
    assert doc["verdict"]["bound_by"] == "broken output" and doc["bench"] == {}
    assert not any(s["name"].startswith("bench") for s in doc["stages"])
    assert doc["target"]["launched"] is True


def test_sweep_reports_wrongly_served_variants_broken(cpu_tiny_variant, tiny_faults, tmp_path):
    from ceiling.flows.sweep import run as run_sweep

    names = ("swapped-v-heads", "sibling-tokenizer")
    files = {n: _variant_file(tmp_path, cpu_tiny_variant, tiny_faults[n], n) for n in names}
    plan = tmp_path / "plan.yaml"
    plan.write_text(
        "name: faults\nrepeats: 2\nbench: {mode: single, max_tokens: 16}\nvariants:\n"
        + "".join(f"  - {{name: {n}, variant: {files[n]}}}\n" for n in names)
    )
    res = run_sweep(plan, tmp_path / "out")
    by = {v.name: v for v in res.variants}
    for name in names:
        assert by[name].status == "broken" and by[name].repeats == 0, by[name]
        assert by[name].error.startswith("broken output: broken: known answers:")
    assert "perplexity" in by["sibling-tokenizer"].error
    assert res.verdict.headline.startswith("The baseline swapped-v-heads gives broken output")
    assert load_variant(files["swapped-v-heads"]).model.endswith("swapped-v-heads")
