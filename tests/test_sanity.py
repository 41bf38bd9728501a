"""The sanity gate on recorded answers of a real vLLM (CPU) serving the tiny trained model.

tests/fixtures/sanity/*.json are real request/answer pairs (recorded by capture.py there); a
local HTTP server replays them, so every request shape and answer shape here is vLLM's own.
Degenerate answers (one token forever, empty text, replacement characters, an early stop) are
the recorded answers edited: a healthy server does not produce them on demand, which is the
point of detecting them. The real-server proofs are in tests/engine/test_sanity_vllm.py.
"""

from __future__ import annotations

import copy
import json
import struct
import threading
from collections.abc import Callable, Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest

from ceiling.sanity import detect
from ceiling.sanity.checks import check_server
from ceiling.sanity.spec import DegenerateRules, load_spec

FIXTURES = Path(__file__).parent / "fixtures" / "sanity"
RULES = DegenerateRules()

Edit = Callable[[dict[str, Any], dict[str, Any]], dict[str, Any] | int]


def _load(name: str) -> dict[str, Any]:
    return json.loads((FIXTURES / name).read_text())


class Replay:
    """Answers /v1/models and /v1/completions from a recording (``edit`` may change answers, or
    return an HTTP status to refuse the request)."""

    def __init__(self, recording: dict[str, Any], edit: Edit | None = None) -> None:
        self.rec, self.edit = recording, edit
        self.requests: list[dict[str, Any]] = []
        replay = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args: object) -> None:
                pass

            def _send(self, code: int, payload: Any) -> None:
                data = json.dumps(payload).encode()
                self.send_response(code)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def do_GET(self) -> None:
                self._send(200, {"object": "list", "data": replay.rec["models"]})

            def do_POST(self) -> None:
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                replay.requests.append(body)
                asked = {k: v for k, v in body.items() if k not in ("model", "temperature")}
                for ex in replay.rec["exchanges"]:
                    if ex["request"] == asked:
                        answer = copy.deepcopy(ex["response"])
                        out = replay.edit(asked, answer) if replay.edit else answer
                        if isinstance(out, int):
                            self._send(out, {"error": {"message": "refused by the test"}})
                        else:
                            self._send(200, out)
                        return
                self._send(400, {"error": {"message": f"not recorded: {asked}"}})

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"

    def __enter__(self) -> Replay:
        threading.Thread(target=self.server.serve_forever, daemon=True).start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def intact() -> dict[str, Any]:
    return _load("vllm_tiny_intact.json")


def _run(recording: dict[str, Any], edit: Edit | None = None, engine: str = "vllm", **kw: Any):
    with Replay(recording, edit) as srv:
        report = check_server(srv.url, "tiny", engine, **kw)
    return report, srv.requests


def _status(report: Any) -> dict[str, str]:
    return {c.name: c.status for c in report.checks}


def test_intact_model_passes_every_check(intact):
    report, requests = _run(intact)
    assert report.verdict == "ok", report.headline
    assert _status(report) == {
        "known answers": "ok",
        "perplexity": "ok",
        "reference": "skipped",  # no model directory given
        "degenerate output": "ok",
        "finish reason": "ok",
    }
    assert report.family == "ceiling-tiny"  # recognised by the served name
    assert report.perplexity == pytest.approx(1.037, abs=0.01)
    assert [p.passed for p in report.probes[:5]] == [True] * 5
    # the requests are greedy and ask vLLM for what the checks read
    assert all(r["temperature"] == 0 for r in requests)
    free = next(r for r in requests if r.get("ignore_eos"))
    assert free["max_tokens"] == 32 and free["return_token_ids"] is True
    assert any(r.get("prompt_logprobs") == 1 for r in requests)


def test_echo_logprobs_of_an_unknown_engine_give_the_same_perplexity():
    rec = _load("vllm_tiny_echo.json")
    report, requests = _run(rec, engine="some-openai-server")
    assert report.verdict == "ok"
    assert report.perplexity == pytest.approx(1.037, abs=0.01)
    # an engine we do not know gets only OpenAI fields: no ignore_eos, so no exact-length check
    assert not any("ignore_eos" in r or "return_token_ids" in r for r in requests)
    assert report.check("finish reason").status == "skipped"
    assert any(r.get("echo") is True and r.get("logprobs") == 1 for r in requests)


def test_wrong_answers_and_high_perplexity_are_broken(intact):
    def garble(asked: dict[str, Any], answer: dict[str, Any]) -> dict[str, Any]:
        choice = answer["choices"][0]
        if asked["prompt"] == "The capital of France is":
            choice["text"] = " Lyon."
        if choice.get("prompt_logprobs"):
            for entry in choice["prompt_logprobs"][1:]:
                for v in entry.values():
                    v["logprob"] -= 2.0  # every token e^2 less likely: perplexity x 7.4
        return answer

    report, _ = _run(intact, garble)
    assert report.verdict == "broken"
    ka = report.check("known answers")
    assert ka.status == "broken" and ka.value == pytest.approx(0.8)
    assert "'The capital of France is' -> ' Lyon.'" in ka.evidence[0]
    ppl = report.check("perplexity")
    assert ppl.status == "broken" and ppl.value == pytest.approx(1.037 * 7.389, rel=0.01)
    assert report.headline.startswith("broken: known answers: 4 of 5 right; perplexity: 7.66")


def test_default_family_tolerates_one_quirk_but_not_most(intact):
    """An unknown model gets the default family's bands: one miss of five is ok, three are not."""
    spec = load_spec()
    fam, why = spec.family(None, "my-llama-70b")
    assert fam.name == "default" and why == "no family rule matched"

    def miss(n: int) -> Edit:
        def edit(asked: dict[str, Any], answer: dict[str, Any]) -> dict[str, Any]:
            ids = [ka.prompt for ka in spec.known_answers[:n]]
            if asked["prompt"] in ids:
                answer["choices"][0]["text"] = " something else"
            return answer

        return edit

    rec = copy.deepcopy(intact)
    rec["models"][0]["id"] = "my-llama-70b"
    with Replay(rec, miss(1)) as srv:
        one = check_server(srv.url, "my-llama-70b", "vllm")
    with Replay(rec, miss(3)) as srv:
        three = check_server(srv.url, "my-llama-70b", "vllm")
    assert one.family == "default" and one.check("known answers").status == "ok"
    assert three.check("known answers").status == "broken" and three.verdict == "broken"


def test_family_from_the_model_directory_marker(tmp_path):
    spec = load_spec()
    (tmp_path / "tiny_model.json").write_text("{}")
    fam, why = spec.family(str(tmp_path), "served-under-another-name")
    assert fam.name == "ceiling-tiny" and "tiny_model.json" in why


def test_refused_prompt_logprobs_skip_perplexity_with_the_reason(intact):
    def refuse(asked: dict[str, Any], answer: dict[str, Any]) -> dict[str, Any] | int:
        return 400 if "prompt_logprobs" in asked else answer

    report, _ = _run(intact, refuse)
    ppl = report.check("perplexity")
    assert ppl.status == "skipped" and "HTTP 400" in ppl.summary
    assert report.verdict == "ok"  # the other checks still ran and passed


def _free_edit(change: Callable[[dict[str, Any], dict[str, Any]], None]) -> Edit:
    def edit(asked: dict[str, Any], answer: dict[str, Any]) -> dict[str, Any]:
        if asked.get("ignore_eos"):
            change(answer["choices"][0], answer["usage"])
        return answer

    return edit


def test_one_token_forever_is_broken(intact):
    def stuck(choice: dict[str, Any], usage: dict[str, Any]) -> None:
        choice["token_ids"] = choice["token_ids"][:3] + [130] * 29
        choice["text"] = " and the" + " the" * 29

    report, _ = _run(intact, _free_edit(stuck))
    deg = report.check("degenerate output")
    assert deg.status == "broken" and "one token forever" in deg.summary
    assert "token id 130 29 times in a row" in deg.evidence[0]
    assert report.verdict == "broken"


def test_empty_text_and_an_early_stop_are_broken(intact):
    def empty(choice: dict[str, Any], usage: dict[str, Any]) -> None:
        choice["text"], choice["finish_reason"] = "   ", "stop"
        choice["token_ids"] = [1]
        usage["completion_tokens"] = 1

    report, _ = _run(intact, _free_edit(empty))
    assert report.check("degenerate output").status == "broken"
    fin = report.check("finish reason")
    assert fin.status == "broken"
    assert "asked for 32 tokens with end-of-sequence ignored, got 1 tokens" in fin.summary
    assert "finish_reason 'stop'" in fin.summary


def test_replacement_characters(intact):
    def bad_bytes(choice: dict[str, Any], usage: dict[str, Any]) -> None:
        choice["text"] = "The \ufffd\ufffd sun \ufffd rises in the east and sets"

    report, _ = _run(intact, _free_edit(bad_bytes))
    deg = report.check("degenerate output")
    assert deg.status == "broken" and "replacement characters" in deg.summary


# ---- detectors on their own ------------------------------------------------------------


def test_detectors_leave_healthy_text_alone():
    text = " and sets in the west. Water boils at one hundred degrees Celsius at sea level."
    assert detect.scan(text, None, 20, RULES) == []
    # a whole sentence repeated under greedy decoding is not a short loop
    again = " The capital of France is Paris." * 4
    assert detect.scan(again, None, 28, RULES) == []
    # the last two characters may hold a multi-byte character cut by the token budget
    assert detect.replacement_chars("ok so far \ufffd", RULES) is None


def test_short_loop_is_suspect_and_names_the_period():
    words = ("one two " * 10).split()
    sig = detect.short_loop(" ".join(["it", "was", *words]), None, RULES)
    assert sig is not None and sig.status == "suspect"
    assert sig.evidence.startswith("a 2-token cycle covers 20 of 22 tokens")
    assert detect.short_loop("one two " * 3, None, RULES) is None  # too short to judge


def test_length_signal():
    assert detect.length_signal(32, 32, "length", "x") is None
    half = detect.length_signal(32, 20, "stop", "x")
    assert half is not None and half.status == "suspect"


# ---- the numpy reference's checkpoint reader ---------------------------------------------


def _safetensors(path: Path, tensors: dict[str, tuple[str, list[int], bytes]]) -> None:
    header, blobs, offset = {}, [], 0
    for name, (dtype, shape, raw) in tensors.items():
        header[name] = {"dtype": dtype, "shape": shape, "data_offsets": [offset, offset + len(raw)]}
        blobs.append(raw)
        offset += len(raw)
    head = json.dumps(header).encode()
    path.write_bytes(struct.pack("<Q", len(head)) + head + b"".join(blobs))


def test_safetensors_reader_decodes_f32_f16_bf16(tmp_path):
    import numpy as np

    from ceiling.sanity.reference import _read_safetensors

    vals = np.array([1.5, -2.25, 3.0, 0.125], dtype=np.float32)
    bf16 = (vals.view(np.uint32) >> 16).astype("<u2").tobytes()
    _safetensors(
        tmp_path / "m.safetensors",
        {
            "a": ("F32", [2, 2], vals.astype("<f4").tobytes()),
            "b": ("F16", [4], vals.astype("<f2").tobytes()),
            "c": ("BF16", [1, 4], bf16),
        },
    )
    out = _read_safetensors(tmp_path / "m.safetensors", 1 << 20)
    assert out["a"].shape == (2, 2) and out["c"].shape == (1, 4)
    for name in "abc":
        assert out[name].reshape(-1).tolist() == vals.tolist()


def test_reference_declines_what_it_does_not_implement(tmp_path):
    from ceiling.sanity.reference import why_not

    assert "no local model directory" in why_not(None, 1 << 30)
    (tmp_path / "config.json").write_text(json.dumps({"architectures": ["DeepseekV3ForCausalLM"]}))
    assert "DeepseekV3ForCausalLM is not one the reference implements" in why_not(
        str(tmp_path), 1 << 30
    )
    (tmp_path / "config.json").write_text(
        json.dumps({"architectures": ["LlamaForCausalLM"], "quantization_config": {"bits": 4}})
    )
    assert "quantized checkpoint" in why_not(str(tmp_path), 1 << 30)
    (tmp_path / "config.json").write_text(
        json.dumps({"architectures": ["LlamaForCausalLM"], "rope_scaling": {"rope_type": "llama3"}})
    )
    assert "rope type llama3" in why_not(str(tmp_path), 1 << 30)


# ---- the command -------------------------------------------------------------------------


def test_cli_json_and_exit_codes(intact, capsys):
    from ceiling.cli import main

    with Replay(intact) as srv:
        assert main(["sanity", "--url", srv.url, "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["kind"] == "sanity" and data["verdict"] == "ok" and data["model"] == "tiny"
    assert data["engine"] == "vllm"  # from /v1/models owned_by

    def wrong(asked: dict[str, Any], answer: dict[str, Any]) -> dict[str, Any]:
        answer["choices"][0]["text"] = " no idea"
        return answer

    with Replay(intact, wrong) as srv:
        assert main(["sanity", "--url", srv.url]) == 1
    assert "broken: known answers: 0 of 5 right" in capsys.readouterr().out


def test_cli_without_a_server_is_one_error_line(capsys):
    from ceiling.cli import main

    assert main(["sanity", "--url", "http://127.0.0.1:9"]) != 0
    err = capsys.readouterr().err
    assert err.startswith("error: no OpenAI-compatible server at http://127.0.0.1:9")
    assert "fix:" in err and "Traceback" not in err


@pytest.fixture(autouse=True)
def _no_api_key(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    monkeypatch.delenv("CEILING_API_KEY", raising=False)
    monkeypatch.delenv("OPENAI_API_KEY", raising=False)
    yield


def test_short_loop_found_wherever_it_is():
    words = "one two " * 10 + "and then the story went on to a quiet end"
    sig = detect.short_loop(words, None, DegenerateRules(loop_min_share=0.5))
    assert sig is not None and sig.evidence.startswith("a 2-token cycle covers 20 of 30")


# ---- the gate in doctor ------------------------------------------------------------------


def test_doctor_stops_before_benchmarking_a_broken_server(intact, tmp_path):
    from ceiling.flows.doctor import DoctorConfig
    from ceiling.flows.doctor import run as run_doctor
    from ceiling.report import render
    from ceiling.sanity.gate import SanityBroken

    def wrong(asked: dict[str, Any], answer: dict[str, Any]) -> dict[str, Any]:
        choice = answer["choices"][0]
        if not asked.get("ignore_eos") and not choice.get("prompt_logprobs"):
            choice["text"] = " and the, and the"
        return answer

    out = tmp_path / "doctor"
    with Replay(intact, wrong) as srv, pytest.raises(SanityBroken) as err:
        run_doctor(
            DoctorConfig(url=srv.url, out_dir=str(out), progress=False, telemetry=False),
            report=render,
        )
    assert "gives broken output (sanity): broken: known answers: 0 of 5 right" in err.value.message
    doc = json.loads((out / "doctor.json").read_text())
    assert doc["sanity"]["verdict"] == "broken"
    assert doc["verdict"]["headline"].startswith("Broken output: known answers: 0 of 5 right")
    assert doc["bench"] == {}  # nothing was benchmarked
    names = [s["name"] for s in doc["stages"]]
    assert "sanity" in names and not any(n.startswith("bench") for n in names)
    report = (out / "report.md").read_text()
    assert "## Output sanity" in report and "| broken | known answers |" in report
    # every request the gate made was a plain completion: none streamed, none timed
    assert all(not r.get("stream") for r in srv.requests)


def test_a_server_refusing_the_extension_fields_is_asked_in_plain_openai(intact):
    """An older or stricter server answers HTTP 400 to ``return_token_ids``/``ignore_eos``:
    the probes are asked again without them (judged on text; no exact-length check then)."""
    plain = copy.deepcopy(intact)
    for ex in plain["exchanges"]:
        ex["request"] = {
            k: v for k, v in ex["request"].items() if k not in ("return_token_ids", "ignore_eos")
        }

    def refuse(asked: dict[str, Any], answer: dict[str, Any]) -> dict[str, Any] | int:
        return answer

    with Replay(plain, refuse) as srv:
        report = check_server(srv.url, "tiny", "vllm")
    assert report.check("known answers").status == "ok"
    assert report.check("finish reason").status != "ok"  # 32 tokens were not forced


def test_an_owner_that_names_no_engine_is_no_engine(intact, monkeypatch):
    """llama-cpp-python's server answers ``owned_by: "me"``: sanity asks it as an
    OpenAI-compatible server of no known engine, and never reports "me" as the engine."""
    from ceiling.flows import sanity as flow

    seen: list[str | None] = []

    def check(url, model, engine, *_a, **_k):
        seen.append(engine)
        raise SystemExit(0)

    monkeypatch.setattr(flow, "check_server", check)
    for owner, want in (("me", None), ("vllm", "vllm")):
        intact["models"] = [dict(m, owned_by=owner) for m in intact["models"]]
        with Replay(intact) as srv, pytest.raises(SystemExit):
            flow.run(flow.SanityConfig(url=srv.url, progress=False))
        assert seen.pop() == want
