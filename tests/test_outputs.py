"""Every file ceiling writes is complete or absent, never replaces a device node, never
overwrites a file silently; names that become file names stay inside the output folder
(issue 25)."""

from __future__ import annotations

import errno
import json
import os
import stat

import pytest

from ceiling import outputs
from ceiling.errors import CeilingError
from ceiling.outputs import inside, safe_name, write_atomic


@pytest.fixture(autouse=True)
def fresh(monkeypatch):
    monkeypatch.setattr(outputs, "_OURS", set())


def _enospc(*_a, **_k):
    raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))


def test_a_full_disk_keeps_the_previous_file_and_says_so(tmp_path, monkeypatch):
    target = tmp_path / "doctor.json"
    target.write_text('{"old": true}\n')
    monkeypatch.setattr(outputs.os, "fsync", _enospc)
    with pytest.raises(CeilingError) as err:
        write_atomic(target, '{"new": true}\n', what="doctor result")
    assert str(target) in err.value.message and "No space left" in err.value.message
    assert "previous doctor.json is unchanged" in err.value.message
    assert err.value.exit_code == 1
    assert target.read_text() == '{"old": true}\n'
    assert sorted(p.name for p in tmp_path.iterdir()) == ["doctor.json"]  # no temp file left


def test_a_full_disk_on_a_new_file_leaves_nothing(tmp_path, monkeypatch):
    monkeypatch.setattr(outputs.os, "fsync", _enospc)
    with pytest.raises(CeilingError, match="was not created"):
        write_atomic(tmp_path / "r.json", "x")
    assert list(tmp_path.iterdir()) == []


def test_an_existing_file_is_kept_beside_the_new_one(tmp_path, capsys):
    target = tmp_path / "run.json"
    target.write_text("first")
    write_atomic(target, "second")
    assert target.read_text() == "second"
    assert (tmp_path / "run.json.~1~").read_text() == "first"
    assert "kept as" in capsys.readouterr().err
    write_atomic(target, "third")  # written by this process already: replaced, no new copy
    assert sorted(p.name for p in tmp_path.iterdir()) == ["run.json", "run.json.~1~"]
    outputs._OURS.clear()  # a later run
    write_atomic(target, "fourth")
    assert (tmp_path / "run.json.~2~").read_text() == "third"


def test_a_device_node_is_written_in_place_never_replaced(tmp_path):
    write_atomic("/dev/null", "x" * 100)
    assert stat.S_ISCHR(os.stat("/dev/null").st_mode)
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    reader = os.open(fifo, os.O_RDONLY | os.O_NONBLOCK)
    try:
        write_atomic(fifo, "hello")
        assert os.read(reader, 100) == b"hello" and stat.S_ISFIFO(os.stat(fifo).st_mode)
    finally:
        os.close(reader)


def test_a_secret_file_is_0600_from_its_first_byte(tmp_path):
    p = write_atomic(tmp_path / "env", "KEY=1\n", mode=0o600)
    assert stat.S_IMODE(p.stat().st_mode) == 0o600


@pytest.mark.parametrize("name", ["../x", "/", "a/b", "..", ".", "", "-rf", "x\ny", "ü 1"])
def test_hostile_names_become_one_safe_component(name, tmp_path):
    safe = safe_name(name)
    assert "/" not in safe and safe not in ("", ".", "..") and not safe.startswith((".", "-"))
    assert inside(tmp_path, tmp_path / f"{safe}.yaml") == tmp_path / f"{safe}.yaml"


def test_names_already_safe_are_unchanged():
    for name in ("cpu-tiny", "ring_ll.v2", "tp8+ep", "a=b"):
        assert safe_name(name) == name


def test_inside_refuses_an_escape(tmp_path):
    with pytest.raises(CeilingError, match="outside"):
        inside(tmp_path / "out", tmp_path / "out" / ".." / "x")
    link = tmp_path / "out2"
    link.mkdir()
    (link / "l").symlink_to("/etc")
    with pytest.raises(CeilingError):
        inside(link, link / "l" / "passwd")


def test_a_sweep_variant_named_to_escape_stays_under_out(tmp_path):
    from ceiling.sweep.plan import load_plan, materialize

    base = tmp_path / "base.yaml"
    base.write_text(f"engine: vllm\nmodel: {tmp_path}\n")
    plan = tmp_path / "plan.yaml"
    names = ["base", "../x", "/", "a/../../b"]
    doc = {"variants": [{"name": "base", "variant": str(base)}]}
    doc["variants"] += [{"name": n, "extends": str(base)} for n in names[1:]]
    plan.write_text(json.dumps(doc))
    out = tmp_path / "out"
    paths = materialize(load_plan(plan), out)
    before = set(tmp_path.rglob("*"))
    for name in names[1:]:
        assert out in paths[name].parents, (name, paths[name])
        assert stat.S_IMODE(paths[name].stat().st_mode) == 0o600
    assert not (tmp_path / "x.yaml").exists() and not (tmp_path / "b.yaml").exists()
    assert {p for p in before if out not in p.parents and p != out} == {
        p for p in set(tmp_path.rglob("*")) if out not in p.parents and p != out
    }


def test_sweep_names_that_collide_as_files_are_refused(tmp_path):
    from ceiling.sweep.plan import load_plan

    base = tmp_path / "base.yaml"
    base.write_text(f"engine: vllm\nmodel: {tmp_path}\n")
    plan = tmp_path / "plan.yaml"
    doc = {"variants": [{"name": n, "extends": str(base)} for n in ("a/b", "a_b")]}
    plan.write_text(json.dumps(doc))
    with pytest.raises(CeilingError, match="same file name"):
        load_plan(plan)


@pytest.mark.parametrize("target", ["/dev/zero", "fifo", "dir"])
def test_inputs_are_regular_files_only(target, tmp_path):
    from ceiling.inputs import read_text

    path = {"/dev/zero": "/dev/zero", "fifo": tmp_path / "f", "dir": tmp_path}[target]
    if target == "fifo":
        os.mkfifo(path)  # a read would block for ever
    with pytest.raises(CeilingError, match=r"not a regular file|directory"):
        read_text(path, "variant file", fix="x")


def test_inputs_have_a_size_limit(tmp_path):
    from ceiling.inputs import read_text

    big = tmp_path / "big.yaml"
    big.write_bytes(b"a" * 2048)
    with pytest.raises(CeilingError, match="larger than"):
        read_text(big, "plan file", fix="x", limit=1024)


def test_json_inputs_refuse_nan_and_infinity(tmp_path):
    from ceiling.inputs import read_json

    for text in ('{"a": NaN}', '{"a": Infinity}', "[-Infinity]"):
        (tmp_path / "c.json").write_text(text)
        with pytest.raises(CeilingError, match="not a number"):
            read_json(tmp_path / "c.json", "model config", fix="x")


@pytest.fixture
def small_tmpfs(mount_tmpfs):
    """A real 64kiB tmpfs (root only; skipped elsewhere): ENOSPC from the kernel itself."""
    return mount_tmpfs("64k")


def test_a_real_full_disk_keeps_the_previous_file(small_tmpfs):
    target = small_tmpfs / "doctor.json"
    target.write_text('{"previous": true}\n')
    with pytest.raises(CeilingError) as err:
        write_atomic(target, "x" * (200 << 10), what="doctor result")
    assert "No space left on device" in err.value.message and "unchanged" in err.value.message
    assert target.read_text() == '{"previous": true}\n'
    assert sorted(p.name for p in small_tmpfs.iterdir()) == ["doctor.json"]


def test_every_cache_of_ceiling_lives_where_ceiling_cache_dir_says(tmp_path, monkeypatch):
    from ceiling.predict.tables import core, store

    monkeypatch.setenv("CEILING_CACHE_DIR", str(tmp_path / "c"))
    assert outputs.cache_dir() == tmp_path / "c"
    # predict's table fits too, not only the engines' flag tables and the env checks
    tinfo = core.TablesInfo(version="9.9", root=str(tmp_path), pinned=True, systems=["h200_sxm"])
    monkeypatch.setattr(store, "info", lambda: tinfo)
    assert tmp_path / "c" in store._system_dir("h200_sxm").parents
    monkeypatch.delenv("CEILING_CACHE_DIR")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "x"))
    assert outputs.cache_dir() == tmp_path / "x" / "ceiling"
    assert tmp_path / "x" / "ceiling" in store._system_dir("h200_sxm").parents


def test_no_other_module_decides_where_the_cache_is():
    import pathlib
    import re

    # code that reads the variable or builds ~/.cache itself (docstrings may name them)
    decides = re.compile(r"""environ(\.get\(|\[)\s*["']XDG_CACHE_HOME|["']\.cache["']""")
    src = pathlib.Path(outputs.__file__).parent
    offenders = [
        str(p.relative_to(src))
        for p in src.rglob("*.py")
        if p.name != "outputs.py" and decides.search(p.read_text())
    ]
    assert offenders == [], "use ceiling.outputs.cache_dir()"
