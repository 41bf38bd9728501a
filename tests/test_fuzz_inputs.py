"""Property-based tests (Hypothesis) over every command's inputs: never a traceback.

For any value of an option, any config file, variant or plan file, engine log, result file or
SSE stream, a command either works or fails with ``error: ...`` + ``fix: ...`` (or Click's usage
error) and a documented non-zero exit code (docs/failures.md); nothing escapes as a traceback,
and what was measured is never lost. Inputs are generated (random values, random JSON/YAML,
binary bytes) and mutated from real files (engine logs in tests/fixtures/logs, a real
doctor.json, a real bench result, real config.json files of the catalog).

The default run is bounded (a few dozen examples per property, derandomized so CI is
reproducible). ``CEILING_FUZZ=long`` runs the long profile (hundreds per property):
    CEILING_FUZZ=long .venv/bin/python -m pytest tests/test_fuzz_inputs.py -q
No property starts an engine, a measurement or a network connection outside 127.0.0.1.
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import re
import socket
import string
from pathlib import Path
from typing import Any

import pytest
import yaml
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from ceiling.cli import main
from ceiling.errors import CeilingError

settings.register_profile(
    "default",
    max_examples=25,
    deadline=None,
    derandomize=True,
    database=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
)
settings.register_profile(
    "long",
    max_examples=500,
    deadline=None,
    database=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
)
settings.load_profile("long" if os.environ.get("CEILING_FUZZ") == "long" else "default")

REPO = Path(__file__).resolve().parents[1]
TRACE = REPO / "tests" / "fixtures" / "trace" / "vllm-cpu-0.32-tiny-rank0.pt.trace.json.gz"
LOGS = sorted((REPO / "tests" / "fixtures" / "logs").glob("*.log"))
DOCTOR_JSON = REPO / "tests" / "data" / "report" / "doctor-cpu.json"
CATALOG = REPO / "src" / "ceiling" / "data" / "models"
EXIT_CODES = {0, 1, 2, 3, 4, 130}
_ERROR = re.compile(r"^error: [^\n]+\n  fix: [^\n]+$", re.M)
_USAGE = re.compile(r"(^|\n)(Usage: ceiling|Error: |Try 'ceiling)")


def run(argv: list[str]) -> tuple[int, str, str]:
    """``ceiling ARGV`` in this process; (exit code, stdout, stderr). Any exception that is not
    a handled failure propagates, and fails the property with its traceback."""
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        rc = main(argv)
    return rc, out.getvalue(), err.getvalue()


#: Invocations of the CLI this process made (each generated test's floor is checked against it).
INVOCATIONS = [0]


def check(argv: list[str], codes: set[int] = EXIT_CODES) -> tuple[int, str, str]:
    """Run and check the failure contract; returns the run for further checks."""
    INVOCATIONS[0] += 1
    rc, out, err = run(argv)
    assert "Traceback" not in out + err, (argv, err)
    assert rc in codes, (argv, rc, err)
    if rc not in (0, 130):
        assert _ERROR.search(err) or _USAGE.search(err), (argv, rc, err)
    return rc, out, err


# ---- strategies ----------------------------------------------------------------------------

json_values = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(min_value=-(2**63), max_value=2**63)
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(max_size=20),
    lambda inner: (
        st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4)
    ),
    max_leaves=12,
)
weird_text = st.text(alphabet=st.characters(codec="utf-8", exclude_categories=("Cs",)), max_size=40)
binary = st.binary(min_size=1, max_size=300).map(lambda b: b"\0" + b)
numbers = st.one_of(
    st.integers(min_value=-(10**12), max_value=10**12).map(str),
    st.floats(allow_nan=True, allow_infinity=True).map(str),
    st.sampled_from(
        ["0", "-1", "1e309", "nan", "inf", "-inf", "", " ", "1,2", "x", "0x10", "1_000"]
    ),
)


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


CLOSED = f"http://127.0.0.1:{_closed_port()}"


def _mutate_json(doc: Any, path: list[Any], value: Any) -> Any:
    """``doc`` with the value at ``path`` (indices taken modulo the container size) replaced."""
    if not path or not isinstance(doc, dict | list) or not doc:
        return value
    if isinstance(doc, dict):
        key = sorted(doc)[path[0] % len(doc)]
        return {**doc, key: _mutate_json(doc[key], path[1:], value)}
    i = path[0] % len(doc)
    return [*doc[:i], _mutate_json(doc[i], path[1:], value), *doc[i + 1 :]]


mutations = st.tuples(st.lists(st.integers(0, 50), min_size=1, max_size=4), json_values)


# ---- predict: options and config.json -------------------------------------------------------


@given(
    tp=numbers,
    pp=numbers,
    batch=numbers,
    context=numbers,
    model=st.sampled_from(["llama-3.1-8b", "qwen2.5-7b", "kimi-k2.5", "nope", ""]),
    gpu=st.sampled_from(["h100-sxm", "rtx-pro-6000", "h200", "gpu?"]),
    link=st.sampled_from([None, "foo", "nvlink4", "self", ""]),
)
def test_predict_options(tp, pp, batch, context, model, gpu, link):
    argv = ["predict", "--model", model, "--gpu", gpu, "--tp", tp, "--pp", pp]
    argv += ["--batch", batch, "--context", context]
    if link is not None:
        argv += ["--link", link]
    rc, out, _ = check(argv, {0, 2})
    if rc == 0:  # an answer is never an impossible one
        assert "-" not in out.split("ms/token")[0].split(":")[-1]


def test_predict_refuses_what_engines_refuse():
    for tp in ("3", "64"):
        rc, _, err = check(["predict", "--model", "llama-3.1-8b", "--gpu", "h100-sxm", "--tp", tp])
        assert rc == 2 and "attention heads" in err
    rc, _, err = check(["predict", "--model", "llama-3.1-8b", "--gpu", "h100-sxm", "--link", "foo"])
    assert rc == 2 and "foo" in err


def _real_config() -> dict[str, Any]:
    return json.loads((CATALOG / "llama-3.1-8b.json").read_text())


@given(mutation=mutations)
def test_predict_mutated_config(tmp_path_factory, mutation):
    path, value = mutation
    cfg = tmp_path_factory.mktemp("cfg") / "config.json"
    cfg.write_text(json.dumps(_mutate_json(_real_config(), path, value)))
    check(["predict", "--model", str(cfg), "--gpu", "h100-sxm"], {0, 2})


@given(doc=json_values)
def test_predict_any_json_config(tmp_path_factory, doc):
    cfg = tmp_path_factory.mktemp("cfg") / "config.json"
    cfg.write_text(json.dumps(doc))
    rc, _, _ = check(["predict", "--model", str(cfg), "--gpu", "h100-sxm"], {0, 2})
    assert rc == 2  # random JSON is never a model


@given(data=binary | weird_text.map(str.encode))
def test_predict_binary_or_text_config(tmp_path_factory, data):
    cfg = tmp_path_factory.mktemp("cfg") / "config.json"
    cfg.write_bytes(data)
    assert check(["predict", "--model", str(cfg), "--gpu", "h100-sxm"], {2})[0] == 2


@pytest.mark.parametrize(
    ("field", "value"),
    [("hidden_size", "big"), ("hidden_size", -4096), ("num_attention_heads", 0),
     ("num_hidden_layers", 2.5), ("vocab_size", None), ("intermediate_size", [1])],
)  # fmt: skip
def test_predict_named_bad_config_values(tmp_path, field, value):
    cfg = _real_config()
    cfg[field] = value
    p = tmp_path / "config.json"
    p.write_text(json.dumps(cfg))
    _rc, _, err = check(["predict", "--model", str(p), "--gpu", "h100-sxm"], {2})
    assert field in err


# ---- variant and plan files ----------------------------------------------------------------

VARIANT_KEYS = ["engine", "model", "args", "env", "port", "host", "name", "extends", "command"]


@given(
    doc=st.dictionaries(st.sampled_from([*VARIANT_KEYS, "junk"]), json_values, max_size=6)
    | json_values
)
def test_variant_files(tmp_path_factory, doc):
    from ceiling.engines.variant import load_variant

    path = tmp_path_factory.mktemp("v") / "v.yaml"
    path.write_text(yaml.safe_dump(doc))
    try:
        load_variant(path)
    except CeilingError as err:
        assert err.message and err.fix and "\n" not in err.message


@given(data=binary | weird_text.map(lambda t: t.encode()))
def test_variant_and_plan_files_through_the_cli(tmp_path_factory, data):
    d = tmp_path_factory.mktemp("vp")
    path = d / "v.yaml"
    path.write_bytes(data)
    assume(b"engine" not in data)  # a valid variant would start an engine
    for argv in (
        ["preflight", str(path)],
        ["launch", "--skip-preflight", str(path)],
        ["launch", "--port", "99999", str(path)],
        ["sweep", str(path), "--out", str(d / "o")],
    ):
        assert check(argv, {2})[0] == 2


@given(
    doc=st.fixed_dictionaries(
        {"variants": json_values}, optional={"bench": json_values, "baseline": json_values}
    )
    | json_values
)
def test_plan_files(tmp_path_factory, doc):
    from ceiling.flows.sweep import _check_bench
    from ceiling.sweep.plan import load_plan

    path = tmp_path_factory.mktemp("p") / "plan.yaml"
    path.write_text(yaml.safe_dump(doc))
    try:
        _check_bench(load_plan(path))
    except CeilingError as err:
        assert err.message and err.fix


@given(port=numbers)
def test_launch_port_values(tmp_path_factory, port):
    path = tmp_path_factory.mktemp("v") / "v.yaml"
    path.write_text("engine: vllm\nmodel: ./does-not-exist\n")
    rc, _, _ = check(["launch", "--skip-preflight", "--port", port, str(path)], {2})
    assert rc == 2  # bad port, or the model path: nothing launched either way


# ---- logs -----------------------------------------------------------------------------------


@given(
    log=st.sampled_from(LOGS),
    ops=st.lists(st.tuples(st.integers(0, 10**6), weird_text | st.just("")), max_size=8),
    engine=st.sampled_from([None, "vllm", "sglang", "llamacpp", "warp"]),
)
def test_mutated_engine_logs(tmp_path_factory, log, ops, engine):
    lines = log.read_text(errors="replace").splitlines()
    for pos, text in ops:  # replace, delete (empty text) or garble lines
        if lines:
            lines[pos % len(lines)] = text
    path = tmp_path_factory.mktemp("log") / "engine.log"
    path.write_text("\n".join(lines))
    argv = ["inspect", str(path), "--json"] + (["--engine", engine] if engine else [])
    rc, out, _ = check(argv, {0, 2})
    if rc == 0:
        json.loads(out)


@given(data=binary)
def test_binary_log(tmp_path_factory, data):
    path = tmp_path_factory.mktemp("log") / "engine.log"
    path.write_bytes(data)
    assert check(["inspect", "--engine", "vllm", str(path)], {2})[0] == 2


# ---- result files: compare and report --------------------------------------------------------


def _bench_result() -> dict[str, Any]:
    from ceiling.bench.results import LevelResult, PerRequest, RunResult, Summary

    reps = [Summary(decode_tok_s_per_stream=v, completed=5) for v in (80.0, 81.0, 82.0)]
    lv = LevelResult(
        concurrency=1,
        completed=15,
        decode_tok_s_per_stream=81.0,
        repeats=reps,
        per_request=PerRequest(tpot_ms=[12.3, 12.4, 12.2]),
    )
    return RunResult(**lv.model_dump(), mode="single", levels=[lv]).model_dump(mode="json")


@given(
    mutation=mutations, metric=st.sampled_from(["decode_tok_s_per_stream", "mean_ttft_ms", "nope"])
)
def test_compare_mutated_results(tmp_path_factory, mutation, metric):
    d = tmp_path_factory.mktemp("cmp")
    a, b = d / "a.json", d / "b.json"
    a.write_text(json.dumps(_bench_result()))
    b.write_text(json.dumps(_mutate_json(_bench_result(), *mutation)))
    check(["compare", str(a), str(b), "--metric", metric], {0, 2})


def test_compare_refuses_a_side_without_requests(tmp_path):
    a, b = tmp_path / "a.json", tmp_path / "b.json"
    a.write_text(json.dumps(_bench_result()))
    empty = _bench_result()
    for holder in [empty, *empty["levels"]]:
        holder.update(completed=0, decode_tok_s_per_stream=None, repeats=[])
        holder["per_request"] = {}
    b.write_text(json.dumps(empty))
    _rc, out, err = check(["compare", str(a), str(b)], {2})
    assert "no request completed" in err or "0 request(s) completed" in err
    assert "no significant difference" not in out
    _rc, _, err = check(["compare", str(a), str(a), "--metric", "decode_tok_s"], {2})
    assert "no metric 'decode_tok_s'" in err


@settings(max_examples=max(6, settings.default.max_examples // 4))  # a render takes ~1 s
@given(mutation=mutations)
def test_report_mutated_doctor_json(tmp_path_factory, mutation):
    d = tmp_path_factory.mktemp("rep")
    doc = json.loads(DOCTOR_JSON.read_text())
    path = d / "doctor.json"
    path.write_text(json.dumps(_mutate_json(doc, *mutation)))
    check(["report", str(path), "--out", str(d / "o")], {0, 2})


@given(data=binary | json_values.map(lambda v: json.dumps(v).encode()))
def test_report_and_compare_on_garbage(tmp_path_factory, data):
    d = tmp_path_factory.mktemp("g")
    path = d / "result.json"
    path.write_bytes(data)
    assert check(["report", str(path)], {2})[0] == 2
    assert check(["compare", str(path), str(path)], {2})[0] == 2


def test_report_on_a_bench_result_renders_it(tmp_path):
    """A plain bench result gets its own report (issue 41), no traceback, no refusal."""
    path = tmp_path / "bench.json"
    path.write_text(json.dumps(_bench_result()))
    check(["report", str(path)], {0})
    assert (tmp_path / "bench-report.md").is_file()


# ---- bench and doctor options (no server: nothing listens on the port) -----------------------


@given(
    opt=st.sampled_from(
        ["--max-tokens", "--input-len", "--requests", "--duration", "--repeat", "--warmup",
         "--rate", "--burstiness", "--timeout", "--stall-timeout", "--concurrency", "--seed"]
    ),
    value=numbers,
    mode=st.sampled_from(["single", "concurrency", "rate", "sideways"]),
)  # fmt: skip
def test_bench_options(opt, value, mode):
    rc, _, err = check(["bench", "--url", CLOSED, "--quiet", "--mode", mode, opt, value], {2, 4})
    if rc == 4:
        assert "cannot reach" in err  # every option was valid: only then the connection


# URLs that need no name resolution (random host names would ask the resolver)
urls = st.builds(
    lambda scheme, cred, host, port, path: f"{scheme}{cred}{host}{port}{path}",
    st.sampled_from(["http://", "https://", "ftp://", "", "http:/", "HTTP://"]),
    st.sampled_from(["", "user:sk-secret-77@", "sk-secret-77@", ":@", "a@b@"]),
    st.sampled_from(["127.0.0.1", "[::1]", "", "999.1.1.1", "[::1", "127.0.0.1 x"]),
    st.sampled_from(["", f":{CLOSED.rsplit(':', 1)[1]}", ":0", ":99999", ":-1", ":abc", ":"]),
    st.sampled_from(["", "/", "/v1", "/v1/", "?api_key=sk-secret-77", "/%zz", "#x"]),
)


@given(url=urls)
def test_bench_and_doctor_urls(tmp_path_factory, url):
    assume(url.strip() and not url.startswith("-"))
    _rc, out, err = check(["bench", "--url", url, "--quiet", "--timeout", "5"], {2, 4})
    assert "sk-secret-77" not in out + err
    out_dir = tmp_path_factory.mktemp("doc")
    _rc, out, err = check(["doctor", "--url", url, "--out", str(out_dir)], {2, 4})
    assert "sk-secret-77" not in out + err


@given(
    opt=st.sampled_from(
        ["--max-tokens", "--input-len", "--repeat", "--concurrency", "--concurrency-max-tokens",
         "--target", "--launch-timeout", "--tp", "--gpu", "--model-path", "--log", "--engine"]
    ),
    value=numbers | weird_text,
)  # fmt: skip
def test_doctor_options_are_checked_before_anything(tmp_path_factory, opt, value):
    assume(not value.startswith("-"))
    out_dir = tmp_path_factory.mktemp("doc")
    rc, _, err = check(["doctor", "--url", CLOSED, "--out", str(out_dir), opt, value], {2, 4})
    if rc == 4:
        assert "no OpenAI-compatible server" in err


def test_doctor_bad_inputs_name_themselves(tmp_path):
    out = str(tmp_path / "o")
    cases = {
        ("--max-tokens", "0"): "--max-tokens",
        ("--repeat", "-1"): "--repeat",
        ("--gpu", "gpu9000"): "gpu9000",
        ("--model-path", str(tmp_path / "nope")): "--model-path",
        ("--log", str(tmp_path / "missing.log")): "--log",
        ("--variant", str(tmp_path / "v.yaml")): "--url and --variant",
    }
    for (opt, value), needle in cases.items():
        _rc, _, err = check(["doctor", "--url", CLOSED, "--out", out, opt, value], {2})
        assert needle in err, (opt, err)


@given(target=st.sampled_from(["dir", "proc", "file-in-file", "dev-null"]))
def test_output_paths_checked_before_measuring(tmp_path_factory, target):
    d = tmp_path_factory.mktemp("out")
    (d / "f").write_text("x")
    path = {
        "dir": str(d),
        "proc": "/proc/nope/x.json",
        "file-in-file": str(d / "f" / "x.json"),
        "dev-null": "/dev/null",
    }[target]
    rc, _, err = check(["bench", "--url", CLOSED, "--quiet", "--out", path], {2, 4})
    # an unwritable --out is refused first (exit 2), before the server is even asked
    assert rc == (4 if target == "dev-null" else 2), err


# ---- probe group: only invalid values (valid ones would measure) -----------------------------


@given(
    argv=st.sampled_from(
        [["commbench", "--world-sizes"], ["commbench", "--reps"], ["commbench", "--batch"],
         ["commbench", "--budget-ms"], ["commbench", "--sizes"], ["calibrate", "--cpu", "--scale"],
         ["telemetry", "--duration"], ["telemetry", "--interval-ms"]]
    ),
    value=st.sampled_from(["0", "-1", "nan", "-inf", "x", "1,,x", "-0.5"]),
)  # fmt: skip
def test_probe_invalid_values(argv, value):
    assert check([*argv, value], {2})[0] == 2


@given(root=weird_text | st.sampled_from(["/proc/self/fd", "/nonexistent", "/etc/hostname"]))
def test_shm_roots(root):
    assume(root.strip() and not root.startswith("-") and "\0" not in root)
    path = Path(root)
    assume(not (path.is_dir() and os.path.realpath(path).startswith("/dev/shm")))
    check(["shm", "--root", root, "--json"], {0, 2})  # never --apply here


# ---- SSE streams -----------------------------------------------------------------------------

sse_lines = st.lists(
    st.sampled_from(
        [b"data: ", b"data:", b": keep-alive", b"event: x", b"\r", b"\n", b"\r\n", b"[DONE]",
         b'{"choices":[{"text":"a","index":0}]}', b'{"choices":[]}', b'{"error":{"message":"x"}}',
         b'{"usage":{"completion_tokens":3}}', b"{", b"\xff\xfe", b"null", b"[1,2]"]
    )
    | st.binary(max_size=20),
    max_size=30,
)  # fmt: skip


@given(parts=sse_lines, cuts=st.lists(st.integers(0, 10**4), max_size=8))
def test_sse_streams_split_anywhere(parts, cuts):
    """Any byte stream, split at any points: the splitter never raises and yields the same
    events as in one piece; parsing marks garbage as malformed instead of raising."""
    from ceiling.bench.client import RawStream
    from ceiling.bench.metrics import process
    from ceiling.bench.sse import SSESplitter

    data = b"".join(parts)
    whole = SSESplitter()
    expected = whole.feed(data)
    split = SSESplitter()
    got: list[tuple[bytes, int]] = []
    prev = 0
    for cut in [*sorted({c % (len(data) + 1) for c in cuts}), len(data)]:
        got += split.feed(data[prev:cut])
        prev = cut
    assert got == expected and split.leftover() == whole.leftover()
    raw = RawStream()
    raw.status = 200
    raw.t_send_ns, raw.t_first_byte_ns = 1_000, 2_000
    raw.events = [(3_000 + i, p) for i, (p, _end) in enumerate(expected)]
    raw.t_end_ns = 10_000_000
    raw.leftover = whole.leftover()
    rec = process(raw, 0, max_tokens=16)
    assert rec.output_tokens >= 0 and rec.malformed_chunks >= 0
    if rec.ok:
        assert rec.error_kind is None


# ---- secrets ---------------------------------------------------------------------------------


@given(
    user=st.text(alphabet=string.ascii_letters + string.digits + "._~-", min_size=1, max_size=10),
    key=st.text(alphabet=string.ascii_letters + string.digits + "-_", min_size=8, max_size=30),
    host=st.sampled_from(["127.0.0.1:8000", "[::1]:80", "gpu-box.internal", "h:1/v1"]),
)
def test_url_credentials_never_printed(user, key, host):
    from ceiling.redact import redact

    url = f"https://{user}:{key}@{host}"
    assert key not in redact(f"error at {url} (x)") and "***@" in redact(url)
    assert redact(f"{url}?api_key={key}x").count(key) == 0


# ---- issue 25: every command, values at the edges, hostile strings and files ------------------
#
# Each invocation runs in a fresh working directory that holds only an ``out`` folder; after it,
# nothing may exist outside ``out`` (nothing written outside --out: the directory's whole tree,
# the two folders above it and the temporary root above those), the exit code is one of
# the documented ones with an ``error:`` line, and with --json a failure is one JSON object on
# stdout. Slow work is never reached: servers are a closed port, commbench stops where torch
# would be imported (a sentinel), env checks a missing interpreter, deploy renders dry.

edges = st.sampled_from(
    ["0", "-1", "-0", "1", "2", "1e308", "1e309", "-1e308", "inf", "-inf", "nan", "NaN",
     "9" * 30, "-" + "9" * 30, "0.5", "1e-300", "", " ", "x", "1,2", "0x10", "1_0", "\x00"]
)  # fmt: skip
hostile = st.sampled_from(
    ["", " ", "'", '"', "'unbalanced", 'a"b', "../x", "/", "..", "a/../../b", "x\ny", "\t",
     "\x1b[31m", "[gpu]", "[bold]x[/bold]", "$(echo hi)", "`id`", ";rm -rf /", "%s%n", "ü",
     "a" * 300, "-", "--", "--help"]
)  # fmt: skip

DEAD_PID = "4194303"  # pid_max's ceiling: no such process


def _argv_for(command: str, opt: str, value: str, variant: Path) -> tuple[list[str], set[int]]:
    """A whole invocation of ``command`` with ``opt value`` and the codes it may end with."""
    base = {
        "predict": (["predict", "--model", "llama-3.1-8b", "--gpu", "h200"], {0, 2}),
        "bench": (["bench", "--url", CLOSED, "--quiet", "--out", "out/r.json"], {2, 4}),
        "doctor": (["doctor", "--url", CLOSED, "--out-dir", "out", "--no-telemetry"], {2, 4}),
        "commbench": (["commbench", "--results", "out/r.json"], {1, 2}),
        "sanity": (["sanity", "--url", CLOSED, "--no-reference"], {2, 4}),
        "ready": (["ready", "--url", CLOSED, "--pid", DEAD_PID], {2, 3}),
        "env": (["env", "--python", "/nonexistent/python"], {2}),
        "deploy": (["deploy", str(variant), "--dry-run", "--image", "x:1"], {0, 2}),
        "launch": (["launch", str(variant), "--skip-preflight"], {2}),
        "compare": (["compare", "out/a.json", "out/b.json"], {2}),
        "trace": (["trace", str(TRACE)], {0, 2}),
        "trace capture": (["trace", "capture", "--url", CLOSED, "--out-dir", "out/tc"], {2, 4}),
        "stop": (["stop"], {0, 1}),
    }[command]
    # a value that starts with a dash (-inf, --help) is given as --opt=VALUE, as is any value
    # of a flag: each is then a value, never taken for an option of its own
    if value.startswith("-") or opt in FLAGS:
        return [*base[0], f"{opt}={value}"], base[1]
    return [*base[0], opt, value], base[1]


OPTIONS = {
    "predict": ["--tp", "--pp", "--batch", "--context", "--mem-clock", "--weight-format"],
    "bench": ["--max-tokens", "--input-len", "--requests", "--duration", "--repeat", "--warmup",
              "--rate", "--burstiness", "--request-timeout", "--stall-timeout", "--seed", "--workers",
              "--temperature", "--concurrency", "--logit-bias", "--max-failed-pct", "--served-model",
              "--mode", "--dataset", "--out"],
    "doctor": ["--max-tokens", "--input-len", "--repeat", "--concurrency", "--target",
               "--ready-timeout", "--tp", "--gpu", "--engine", "--max-failed-pct",
               "--stall-timeout", "--model", "--log", "--concurrency-max-tokens"],
    "commbench": ["--world-sizes", "--sizes", "--variant", "--env", "--backend",
                  "--buffer-dtype", "--reps", "--budget-ms", "--rank-timeout", "--batch", "--model"],
    "sanity": ["--request-timeout", "--model", "--served-model", "--engine", "--dtype"],
    "ready": ["--ready-timeout", "--path"],
    "env": ["--tp", "--shm-root", "--engine"],
    "deploy": ["--gpus", "--ready-timeout", "--env-file", "--image"],
    "launch": ["--port", "--ready-timeout"],
    "compare": ["--metric"],
    "trace": ["--engine", "--window", "--model", "--gpu", "--tp", "--batch", "--context", "--out",
              "--profile-out", "--report"],
    "trace capture": ["--steps", "--streams", "--ranks", "--engine", "--engine-version",
                      "--served-model", "--trace-dir", "--out-dir"],
    "stop": ["--all"],
}  # fmt: skip
CALLS = [(c, o) for c, opts in OPTIONS.items() for o in opts]
#: options that take no value (given a value as --opt=VALUE: a usage error)
FLAGS = {"--all"}
#: options whose value is where the command writes: there it may write, whatever the value
WRITES_TO = {"--out", "--out-dir", "--results", "--profile-out", "--report"}


@pytest.fixture
def sandbox(tmp_path_factory, monkeypatch):
    """A fresh working directory with an ``out`` folder, two private folders deep (``../x``
    and ``a/../../b`` land where :func:`_tree` sees them); commbench stops before torch."""
    from ceiling.probe import commbench

    def reached(*_a: Any, **_k: Any) -> Any:
        raise CeilingError("valid: torch would start here", fix="-", exit_code=1)

    monkeypatch.setattr(commbench, "_torch_facts", reached)
    d = tmp_path_factory.mktemp("sandbox") / "a" / "cwd"
    (d / "out").mkdir(parents=True)
    (d / "variant.yaml").write_text(f"engine: vllm\nmodel: {d / 'no-model'}\n")
    monkeypatch.chdir(d)
    monkeypatch.setenv("CEILING_STATE_DIR", str(d / "out" / "state"))
    return d


def _tree(d: Path) -> set[str]:
    """Every path around the working directory ``d`` but its ``out``: the whole tree of the
    sandbox (``d``'s grandparent, ``d`` included) and the names in the folder above that."""
    root, out = d.parent.parent, d / "out"
    seen = {f"../{p.name}" for p in root.parent.iterdir()}
    for top, dirs, files in os.walk(root):
        if Path(top) == d:
            dirs[:] = [x for x in dirs if d / x != out]
        seen.update(os.path.join(top, n) for n in dirs + files)
    return seen


def _nothing_outside(d: Path, before: set[str]) -> None:
    after = _tree(d)
    assert after <= before, f"written outside --out: {sorted(after - before)}"


@pytest.mark.parametrize("where", ["../x", "../../x", "../../../x", "sub/x", "out/../y"])
def test_a_write_anywhere_but_out_is_seen(sandbox, where):
    """The check itself: a file beside the working directory, above it or in a folder of it
    is found (the old check listed the working directory's top level only)."""
    (sandbox / "sub").mkdir(exist_ok=True)
    before = _tree(sandbox)
    target = sandbox / where
    target.write_text("x")
    try:
        with pytest.raises(AssertionError, match="written outside --out"):
            _nothing_outside(sandbox, before)
    finally:
        target.unlink()


@settings(max_examples=max(190, settings.default.max_examples * 7))
@given(call=st.sampled_from(CALLS), value=edges | hostile, as_json=st.booleans())
def test_every_command_at_the_edges(sandbox, call, value, as_json):
    command, opt = call
    argv, codes = _argv_for(command, opt, value, sandbox / "variant.yaml")
    if as_json and command not in ("launch",):
        argv.append("--json")
    before = _tree(sandbox)
    rc, out, _ = check(argv, codes | {2})
    if opt not in WRITES_TO:  # else the value IS where it writes
        _nothing_outside(sandbox, before)
    if as_json and rc not in (0, 130) and "--json" in argv:
        doc = json.loads(out)  # one document: the error object
        assert (
            isinstance(doc, dict) and {"error", "exit_code"} <= set(doc) and doc["exit_code"] == rc
        )


def _special(kind: str, d: Path, suffix: str = "") -> str:
    """A path of ``kind``: a directory, a FIFO, a device, an empty, a binary or a big file;
    ``suffix``: its name ends so (a device is then a link of that name to it)."""
    p = d / f"in-{kind}{suffix}"
    if kind == "dir":
        p.mkdir(exist_ok=True)
    elif kind == "fifo":
        if not p.exists():
            os.mkfifo(p)
    elif kind in ("zero", "null", "urandom"):
        if not suffix:
            return f"/dev/{kind}"
        if not p.is_symlink():
            p.symlink_to(f"/dev/{kind}")
    elif kind == "empty":
        p.write_bytes(b"")
    elif kind == "binary":
        p.write_bytes(b"\0\xff" * 64)
    elif kind == "big":
        with p.open("wb") as fh:
            fh.truncate(300 << 20)  # sparse, over the 256 MiB input limit
    elif kind == "nan":
        p.write_text('{"a": NaN, "kind": "bench", "schema_version": 1}')
    return str(p)


FILE_INPUTS = [
    ["inspect", "{f}"], ["compare", "{f}", "{f}"], ["report", "{f}"],
    ["predict", "--model", "{f}", "--gpu", "h200"], ["preflight", "{f}"],
    ["launch", "{f}", "--skip-preflight"], ["deploy", "{f}", "--dry-run", "--image", "x:1"],
    ["sweep", "{f}", "--out-dir", "out/sw"], ["bench", "--url", CLOSED, "--dataset", "{f}", "--quiet", "--out", "out/r.json"],
    ["doctor", "--url", CLOSED, "--log", "{f}", "--out-dir", "out"],
    ["commbench", "--merge", "{f}", "--out", "out/p.json"],
    ["sanity", "--variant", "{f}"],
    ["trace", "{f}"],
    ["predict", "--model", "llama-3.1-8b", "--gpu", "h200", "--engine", "trtllm", "--trtllm-config", "{f}"],
    ["predict", "--engine", "llamacpp", "--gguf", "{f}", "--gpu", "h200"],
    ["predict", "--model", "llama-3.1-8b", "--gpu", "{f}.yaml"],
    ["predict", "--model", "llama-3.1-8b", "--gpu", "h200", "--profile", "{f}"],
    ["doctor", "--url", CLOSED, "--llama-bench", "{f}", "--out-dir", "out"],
    ["doctor", "--url", CLOSED, "--llamacpp-profile", "{f}", "--out-dir", "out"],
    ["calibrate", "--engine", "llamacpp", "--from-output", "{f}"],
]  # fmt: skip
#: (option, kind) a generated file may be valid for: the NaN file is a YAML mapping of strings
MAY_BE_VALID = {("--trtllm-config", "nan")}


@settings(max_examples=max(130, settings.default.max_examples * 5))
@given(
    argv=st.sampled_from(FILE_INPUTS),
    kind=st.sampled_from(["dir", "fifo", "zero", "null", "urandom", "empty", "binary", "big", "nan"]),
    as_json=st.booleans(),
)  # fmt: skip
def test_every_input_file_is_regular_and_bounded(sandbox, argv, kind, as_json):
    """A FIFO would hang, /dev/zero would grow the process without bound, a big file would be
    read whole: each is one line, at once."""
    f = _special(kind, sandbox, ".yaml" if "{f}.yaml" in argv else "")
    full = [f if a in ("{f}", "{f}.yaml") else a for a in argv] + (
        ["--json"] if as_json and argv[0] != "launch" else []
    )
    before = _tree(sandbox)
    valid = {0} if any((a, kind) in MAY_BE_VALID for a in argv) else set()
    rc, _, err = check(full, {2, 4} | valid)
    _nothing_outside(sandbox, before)
    if kind in ("dir", "fifo", "zero", "urandom", "big") and rc == 2:
        assert any(
            w in err
            for w in (
                "not a regular file",
                "directory",
                "larger than",
                "not found",
                "not a",
                "FIFO",
            )
        ), err


#: The CLI invocations each generated test makes in the default profile (derandomized: the same
#: every run); issue 25's budget (>= 500 per run of the module) is their sum. A floor per test
#: rather than one counter over the module: under pytest-xdist the module's tests are spread over
#: several processes, and no process sees them all.
FLOORS = {
    "test_predict_options": 25,
    "test_predict_mutated_config": 25,
    "test_predict_any_json_config": 25,
    "test_predict_binary_or_text_config": 25,
    "test_variant_and_plan_files_through_the_cli": 100,
    "test_launch_port_values": 25,
    "test_mutated_engine_logs": 25,
    "test_binary_log": 25,
    "test_compare_mutated_results": 25,
    "test_report_mutated_doctor_json": 6,
    "test_report_and_compare_on_garbage": 50,
    "test_bench_options": 25,
    "test_bench_and_doctor_urls": 50,
    "test_doctor_options_are_checked_before_anything": 25,
    "test_output_paths_checked_before_measuring": 4,
    "test_probe_invalid_values": 25,
    "test_shm_roots": 25,
    "test_every_command_at_the_edges": 190,
    "test_every_input_file_is_regular_and_bounded": 130,
}


@pytest.fixture(autouse=True)
def _invocation_floor(request):
    """Each generated test makes at least its floor of invocations (fewer examples, or a
    strategy narrowed until Hypothesis runs out of inputs, fail here)."""
    before = INVOCATIONS[0]
    yield
    made, floor = INVOCATIONS[0] - before, FLOORS.get(request.node.name, 0)
    assert made >= floor, f"{request.node.name}: {made} CLI invocations, its floor is {floor}"


def test_the_fuzz_budget_is_met():
    """Issue 25: at least 500 generated invocations per run of this module, as the sum of the
    generated tests' floors (each enforced by _invocation_floor), every floor a test here."""
    for name in FLOORS:
        assert getattr(globals().get(name), "is_hypothesis_test", False), name
    print(f"fuzz: at least {sum(FLOORS.values())} invocations")
    assert sum(FLOORS.values()) >= 500
