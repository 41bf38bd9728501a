"""Speculative decoding in predict: k draft passes + one verify at k+1 tokens per sequence,
from the same per-op model, divided by the acceptance length."""

from __future__ import annotations

import json

import pytest

from ceiling.cli import main
from ceiling.errors import CeilingError
from ceiling.predict.api import PredictRequest, predict
from ceiling.predict.specdec import acceptance, mtp_layers, spec_data
from ceiling.spec.model import load_model

QWEN = dict(model="qwen3.5-397b-a17b-nvfp4", gpu="rtx-pro-6000", gpus=4, tp=4)


def test_step_is_drafts_plus_verify_over_the_acceptance_length(priors_only):
    base = predict(PredictRequest(**QWEN))
    p = predict(PredictRequest(**QWEN, spec="mtp", spec_tokens=2))
    sp = p.details.speculative
    assert sp.draft_tokens == 2 and sp.method == "mtp"
    tau = sp.acceptance_length
    assert p.decode_ms_per_token == pytest.approx(sp.step_ms / tau, rel=1e-3)
    assert sp.step_ms >= sp.verify_ms + sp.draft_ms  # + the engine's sampling kernels
    # the verify step reads the 3-token batch's weights (more experts) but each sequence's KV
    # cache once (an MLA model: no recurrent state, whose per-token copies the engine keeps)
    ds = dict(model="deepseek-v3", gpu="h200", tp=8, context=8192)
    plain = predict(PredictRequest(**ds))
    mtp = predict(PredictRequest(**ds, spec="mtp", spec_tokens=2))
    assert mtp.details.kv_bytes_read_per_gpu == pytest.approx(
        plain.details.kv_bytes_read_per_gpu, rel=0.01
    )
    assert mtp.details.weight_bytes_read_per_gpu > plain.details.weight_bytes_read_per_gpu
    assert sp.verify_ms > base.decode_ms_per_token
    # the draft passes run the MTP layer (and the lm_head) each drafted token
    names = {op.name for op in p.expected.ops}
    assert any(n.startswith("draft.moe") for n in names) and "draft.lm_head" in names
    # vLLM's first draft pass runs over the k+1 verified tokens, the second over the batch
    first = next(op for op in p.expected.ops if op.name == "draft1.lm_head")
    assert first.count == pytest.approx(1 / tau, rel=1e-3) and "spec.sampling" in names
    assert "draft.eh_proj" in names
    # the bound takes every draft accepted; expected never beats it
    assert p.bound.decode_ms_per_token <= p.decode_ms_per_token
    assert any("speculative decoding mtp" in a for a in p.assumptions)


def test_acceptance_inputs_and_defaults():
    a = spec_data().methods["mtp"].alpha
    tau, src = acceptance("mtp", 3, None, None)
    assert tau == pytest.approx(1 + a + a**2 + a**3) and "DeepSeek-V3" in src
    assert acceptance("mtp", 2, 0.892, None)[0] == pytest.approx(2.784)
    assert acceptance("eagle3", 3, None, 2.5)[0] == 2.5
    with pytest.raises(CeilingError, match="outside 1-4"):
        acceptance("eagle3", 3, None, 4.5)


def test_low_acceptance_makes_it_slower(priors_only):
    """A draft that is rarely accepted costs more than it saves: the sign flips."""
    base = predict(PredictRequest(**QWEN)).decode_tok_s_per_stream
    poor = predict(PredictRequest(**QWEN, spec="mtp", spec_acceptance_length=1.05))
    good = predict(PredictRequest(**QWEN, spec="mtp", spec_acceptance_rate=0.9))
    assert poor.decode_tok_s_per_stream < base < good.decode_tok_s_per_stream


def test_methods_and_refusals(priors_only):
    assert mtp_layers(load_model("deepseek-v3")) == 1
    assert mtp_layers(load_model("llama-3.1-8b")) == 0
    with pytest.raises(CeilingError) as exc:
        predict(PredictRequest(model="llama-3.1-8b", gpu="h200", spec="mtp"))
    assert "no MTP layers" in exc.value.message and "eagle3" in exc.value.fix
    base = predict(PredictRequest(model="llama-3.1-8b", gpu="h200"))
    e3 = predict(PredictRequest(model="llama-3.1-8b", gpu="h200", spec="eagle3"))
    assert "draft.fc" in {op.name for op in e3.expected.ops}
    ng = predict(PredictRequest(model="llama-3.1-8b", gpu="h200", spec="ngram"))
    assert not any(op.name.startswith("draft.") for op in ng.expected.ops)
    assert ng.details.speculative.draft_ms > 0  # the CPU lookup
    assert e3.decode_tok_s_per_stream > base.decode_tok_s_per_stream


def test_what_if_offers_speculative_decoding(priors_only):
    p = predict(PredictRequest(**QWEN, what_if=True))
    rows = {w.change: w for w in p.what_if or []}
    assert any(c.startswith("MTP speculative decoding") for c in rows)
    q = predict(PredictRequest(model="llama-3.1-8b", gpu="h200", what_if=True))
    e3 = [w for c, w in {w.change: w for w in q.what_if or []}.items() if "EAGLE-3" in c]
    assert e3 and "draft" in e3[0].note
    r = predict(PredictRequest(**QWEN, spec="mtp", what_if=True))
    assert any(w.change == "speculative decoding off" for w in r.what_if or [])
    # the PCIe case where MTP loses (vLLM, bf16 KV on FA2, 128k context): the what-if says so
    for ctx, gains in ((1024, True), (131072, False)):
        long = predict(PredictRequest(**{**AWQ_LONG, "context": ctx}, what_if=True))
        mtp = next(w for w in long.what_if or [] if w.change.startswith("MTP"))
        assert (mtp.delta_pct > 0) is gains, (ctx, mtp.delta_pct)


def test_cli_spec_options(capsys, priors_only):
    argv = ["predict", "--model", "deepseek-v3", "--gpu", "h200", "--tp", "8", "--spec", "mtp",
            "--spec-tokens", "3", "--spec-acceptance-rate", "0.8", "--json"]  # fmt: skip
    assert main(argv) == 0
    d = json.loads(capsys.readouterr().out)
    assert d["details"]["speculative"]["acceptance_length"] == pytest.approx(3.4)
    assert main([*argv[:-1], "--spec-acceptance-rate", "1.5"]) == 2
    assert "error:" in capsys.readouterr().err


def test_doctor_reads_the_servers_speculative_decoding_and_acceptance(priors_only):
    """A vLLM log with a speculative config and a metrics line: the facts carry the method,
    the drafted tokens and the measured acceptance length, and the doctor's request predicts
    with them (the acceptance measured by the engine, not the default)."""
    from pathlib import Path

    from ceiling.diagnose.expect import _speculative
    from ceiling.diagnose.logs import parse_lines

    log = Path(__file__).parent / "fixtures" / "logs" / "vllm_0.32_gpu_bf16_h200.log"
    text = log.read_text().replace(
        "speculative_config=None",
        "speculative_config=SpeculativeConfig(method='deepseek_mtp', model='x', num_spec_tokens=3)",
    )
    metrics = (
        "(APIServer pid=3100) INFO 05-20 09:12:40 [metrics.py:121] SpecDecoding metrics: Mean "
        "acceptance length: 2.60, Accepted throughput: 20.15 tokens/s, Drafted throughput: "
        "195.00 tokens/s, Accepted: 403 tokens, Drafted: 3900 tokens, Per-position acceptance "
        "rate: 0.7, 0.5, 0.4, Avg Draft acceptance rate: 53.3%"
    )
    facts = parse_lines([*text.splitlines(), metrics], engine="vllm")
    assert (facts.spec_method, facts.spec_tokens, facts.spec_mean_acceptance) == ("mtp", 3, 2.6)
    fields = _speculative(facts)
    assert fields == {"spec": "mtp", "spec_tokens": 3, "spec_acceptance_length": 2.6}
    p = predict(PredictRequest(model="deepseek-v3", gpu="h200", tp=8, **fields))
    sp = p.details.speculative
    assert sp is not None and sp.acceptance_length == 2.6 and "given" in sp.acceptance_source
    plain = parse_lines(log.read_text().splitlines(), engine="vllm")
    assert plain.spec_method is None and _speculative(plain) == {}


AWQ_LONG = dict(model="qwen3.5-397b-a17b", weight_format="awq", gpu="rtx-pro-6000", gpus=4, tp=4,
                engine="vllm", context=131072)  # fmt: skip


def test_vllm_verify_attention_loses_its_kv_split_on_fa2(priors_only):
    """vLLM on SM120 runs bf16-KV attention on FA2 (platforms/cuda.py), whose verify pass at
    k+1 query tokens has no KV split: at long context MTP is slower than none (published:
    rtx6kpro AWQ TP4 at 128k, 95 -> 40 tok/s). The fp8 KV cache goes to FlashInfer (no such
    loss), as does an SM100 GPU; SGLang passes num_splits on its verify path."""
    plain = predict(PredictRequest(**AWQ_LONG)).decode_tok_s_per_stream
    mtp = predict(PredictRequest(**AWQ_LONG, spec="mtp", spec_tokens=2))
    assert mtp.decode_tok_s_per_stream < 0.6 * plain
    assert "verify.attention_no_kv_split" in {op.name for op in mtp.expected.ops}
    assert any("fa2" in n for n in mtp.details.speculative.engine_path)
    fp8 = {**AWQ_LONG, "kv_dtype": "fp8"}
    assert predict(PredictRequest(**fp8, spec="mtp", spec_tokens=2)).decode_tok_s_per_stream > (
        predict(PredictRequest(**fp8)).decode_tok_s_per_stream
    )
    short = predict(PredictRequest(**{**AWQ_LONG, "context": 1024}, spec="mtp", spec_tokens=2))
    assert (
        short.decode_tok_s_per_stream
        > predict(PredictRequest(**{**AWQ_LONG, "context": 1024})).decode_tok_s_per_stream
    )  # a short context keeps the gain: the loss grows with the KV
    sgl = predict(PredictRequest(**{**AWQ_LONG, "engine": "sglang"}, spec="mtp", spec_tokens=2))
    assert "verify.attention_no_kv_split" not in {op.name for op in sgl.expected.ops}


def test_vllm_piecewise_graphs_under_spec_decode(priors_only):
    """FlashInfer below UNIFORM_BATCH (not SM10x) turns the target's graphs piecewise under spec
    decode (config/compilation.py); the host then issues a graph per layer and each attention
    op eagerly: a chain the step waits for when it is longer than the GPU's work."""
    from ceiling.predict.specpath import EnginePath

    small = dict(model="qwen3-30b-a3b-fp8", gpu="rtx-pro-6000", engine="vllm", kv_dtype="fp8")
    p = predict(PredictRequest(**small, spec="eagle3", spec_tokens=3))
    sp = p.details.speculative
    assert sp.host_issue_ms > 0 and any("target piecewise" in n for n in sp.engine_path)
    b200 = predict(PredictRequest(**{**small, "gpu": "b200"}, spec="eagle3", spec_tokens=3))
    assert not any("target piecewise" in n for n in b200.details.speculative.engine_path)
    assert b200.details.speculative.host_issue_ms < sp.host_issue_ms
    path = spec_data().engine_paths["vllm"]
    assert isinstance(path, EnginePath) and path.draft_piecewise


def test_doctor_predicts_with_the_acceptance_its_engine_counted(priors_only):
    """vLLM's /metrics counters over the measured run (recorded from vLLM 0.32's own
    SpecDecodingProm: tests/fixtures/metrics/record_vllm_spec.py) give the acceptance length
    1 + accepted / drafts; the doctor puts it in the facts, ahead of the log's last metrics
    line, and predict uses it."""
    from pathlib import Path

    from ceiling.bench.results import RunResult
    from ceiling.bench.server_metrics import compare_to_client, delta
    from ceiling.diagnose.expect import _speculative
    from ceiling.diagnose.facts import EngineFacts
    from ceiling.diagnose.measured import ServerView, counted_acceptance
    from ceiling.diagnose.schema import DoctorResult
    from ceiling.flows.doctor import _counted_acceptance

    here = Path(__file__).parent / "fixtures" / "metrics"
    before = (here / "vllm_0.32_spec_before.txt").read_text()
    after = (here / "vllm_0.32_spec_after.txt").read_text()
    server = compare_to_client(delta(before, after), {})
    view = ServerView.model_validate(server)
    got = counted_acceptance(view)
    assert got is not None
    tau, line = got
    assert tau == pytest.approx(1 + 642 / 400)  # the run's drafts, not the warm-up's
    assert "80.2% of drafted" in line and "vllm:spec_decode_num_drafts_total" in line
    assert counted_acceptance(ServerView()) is None  # no /metrics: nothing counted

    facts = EngineFacts(spec_method="mtp", spec_tokens=2, spec_mean_acceptance=1.9)
    res = DoctorResult(facts=facts, bench={"single": RunResult(server_metrics=server)})
    assert _counted_acceptance(res)
    assert facts.spec_mean_acceptance == pytest.approx(2.605)
    fields = _speculative(facts)
    assert fields["spec_acceptance_length"] == pytest.approx(2.605)
    p = predict(PredictRequest(**QWEN, **fields))
    assert p.details.speculative.acceptance_length == pytest.approx(2.605)
    assert not _counted_acceptance(DoctorResult(facts=EngineFacts(), bench={}))
