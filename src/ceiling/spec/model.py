"""ModelSpec from a catalog name, a ``config.json`` file or a model directory.

The nouns (``ModelSpec``, ``Module``, ``LayerSpec``) live in ``modelspec.py``; how a config
becomes one, per model family, in ``families/``. Both are re-exported here.

Accepted inputs: a short catalog name (``kimi-k2.5``), a path to a ``config.json`` file, or a
model directory holding ``config.json`` (and optionally ModelOpt's ``hf_quant_config.json``).
"""

from __future__ import annotations

import json
from functools import cache
from importlib import resources
from pathlib import Path
from typing import Any

from ceiling.errors import CeilingError
from ceiling.inputs import read_json
from ceiling.spec.families import KNOWN_ARCHITECTURES, build_model
from ceiling.spec.modelspec import LayerSpec, ModelSpec, Module
from ceiling.spec.quant import WeightFormat

__all__ = [
    "KNOWN_ARCHITECTURES",
    "LayerSpec",
    "ModelSpec",
    "Module",
    "build_model",
    "catalog",
    "list_models",
    "load_model",
]

# ----------------------------------------------------------------------------- loading


def _data_dir() -> Path:
    return Path(str(resources.files("ceiling") / "data" / "models"))


@cache
def catalog() -> dict[str, Path]:
    """Short name -> config path of the reference models shipped with the package."""
    out: dict[str, Path] = {}
    for p in sorted(_data_dir().iterdir()):
        if p.suffix == ".json":
            out[p.stem] = p
        elif p.is_dir() and (p / "config.json").is_file():
            out[p.name] = p / "config.json"
    return out


def is_model_input(text: str) -> bool:
    """Whether ``text`` names a model the way ``--model`` does (docs/cli.md): a catalog name,
    a ``config.json`` or a model directory here. (A served name is none of these.)"""
    return text in catalog() or Path(text).expanduser().exists()


def list_models() -> list[dict[str, str]]:
    """Catalog entries with the Hugging Face id they come from."""
    rows = []
    for name, path in catalog().items():
        raw = json.loads(path.read_text())
        prov = raw.get("_provenance")
        hf = raw.get("_hf_model") or (prov.get("hf_model", "") if isinstance(prov, dict) else "")
        rows.append(
            {"name": name, "hf_model": hf, "architecture": (raw.get("architectures") or ["?"])[0]}
        )
    return rows


def _read_json(p: Path) -> dict[str, Any]:
    data = read_json(p, "model config", fix="pass a Hugging Face config.json")
    if not isinstance(data, dict):
        raise CeilingError(
            f"model config {p} holds a JSON {type(data).__name__}, not an object",
            fix="pass a Hugging Face config.json",
        )
    return data


def load_model(name_or_path: str, weight_format: WeightFormat | None = None) -> ModelSpec:
    """ModelSpec from a catalog name, a ``config.json`` path, or a model directory."""
    cat = catalog()
    hf_quant = None
    if name_or_path in cat:
        cfg_path = cat[name_or_path]
        name = name_or_path
    else:
        p = Path(name_or_path).expanduser()
        if p.is_dir():
            cfg_path = p / "config.json"
            if not cfg_path.is_file():
                raise CeilingError(
                    f"no config.json in directory {p}", fix="point --model at a HF model directory"
                )
        elif p.is_file():
            cfg_path = p
        else:
            raise CeilingError(
                f"unknown model '{name_or_path}': not a catalog name, file or directory",
                fix="see `ceiling predict --list-models`, or pass a path to a config.json",
            )
        name = p.name if p.is_dir() else p.stem
    hq = cfg_path.parent / "hf_quant_config.json"
    if hq.is_file():
        hf_quant = _read_json(hq)
    raw = _read_json(cfg_path)
    try:
        spec = build_model(raw, name=name, source=str(cfg_path), hf_quant=hf_quant)
    except (ValueError, TypeError, KeyError, IndexError, AttributeError, ZeroDivisionError) as exc:
        # a value of the wrong shape the explicit checks (spec/checks.py) did not name
        raise CeilingError(
            f"model config {cfg_path} is malformed: {type(exc).__name__}: {exc}",
            fix="pass an unmodified Hugging Face config.json",
        ) from None
    return spec.with_weight_format(weight_format)
