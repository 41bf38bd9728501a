"""An engine staged outside any venv (a site directory on PYTHONPATH, an interpreter found on
PATH) is found, versioned and asked for its flags with the variant's own variables: the form
the GPU image's vLLM takes (experiments/gpu/vllm_session.sh)."""

from __future__ import annotations

import sys
from pathlib import Path

from ceiling.engines import get_engine
from ceiling.engines.base import dist_versions
from ceiling.engines.variant import Variant


def _site_with_dist(root: Path, dist: str, version: str) -> Path:
    site = root / "site"
    info = site / f"{dist}-{version}.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {dist}\nVersion: {version}\n")
    return site


def test_a_bare_python_name_is_found_on_the_variants_path_with_its_pythonpath(tmp_path):
    site = _site_with_dist(tmp_path, "vllm", "0.25.0")
    exe = Path(sys.executable)
    variant = Variant(
        name="staged",
        engine="vllm",
        model="/models/x",
        python=exe.name,
        env={"PATH": str(exe.parent), "PYTHONPATH": str(site)},
    )
    install = get_engine("vllm").locate(variant)
    assert install.python is not None and install.python.parent == exe.parent
    assert install.version == "0.25.0" and install.dist == "vllm"
    assert install.env["PYTHONPATH"] == str(site)


def test_the_version_probe_is_cached_per_pythonpath(tmp_path):
    a = _site_with_dist(tmp_path / "a", "vllm", "0.25.0")
    b = _site_with_dist(tmp_path / "b", "vllm", "0.26.1")
    py = sys.executable
    assert dist_versions(py, ("vllm",), (("PYTHONPATH", str(a)),))["vllm"] == "0.25.0"
    assert dist_versions(py, ("vllm",), (("PYTHONPATH", str(b)),))["vllm"] == "0.26.1"
