"""ModelSpec from a catalog name, a ``config.json`` file or a model directory.

The nouns (``ModelSpec``, ``Module``, ``LayerSpec``) live in ``modelspec.py``; how a config
becomes one, per model family, in ``families/``. Both are re-exported here.

Accepted inputs: a short catalog name (``kimi-k2.5``) or the Hugging Face id a catalog entry
comes from (``meta-llama/Llama-3.3-70B-Instruct``), either in any letter case; a path to a
``config.json`` file, or a model directory holding ``config.json`` (and optionally ModelOpt's
``hf_quant_config.json``). A local path wins over a Hugging Face id of the same spelling.
"""

from __future__ import annotations

import difflib
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
    "catalog_name",
    "did_you_mean",
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


@cache
def _spellings() -> dict[str, str]:
    """Every spelling ``--model`` accepts for a catalog entry, lower-cased -> its name: the
    short name and the Hugging Face id it comes from (``--list-models`` shows both)."""
    rows = list_models()
    out = {row["name"].lower(): row["name"] for row in rows}
    for row in rows:
        if row["hf_model"]:
            out.setdefault(row["hf_model"].lower(), row["name"])
    return out


def catalog_name(text: str) -> str | None:
    """The catalog entry ``text`` names (a short name or a Hugging Face id, any letter case);
    None when it names none."""
    if text in catalog():
        return text
    return _spellings().get(text.strip().lower())


def did_you_mean(text: str) -> str:
    """`` (did you mean 'llama-3.3-70b' / 'meta-llama/Llama-3.3-70B-Instruct'?)``, or ""."""
    close = difflib.get_close_matches(text.strip().lower(), list(_spellings()), n=6, cutoff=0.6)
    names = list(dict.fromkeys(_spellings()[c] for c in close))[:3]
    if not names:
        return ""
    hf = {row["name"]: row["hf_model"] for row in list_models()}
    shown = [f"'{n}'" + (f" ({hf[n]})" if hf.get(n) else "") for n in names]
    return f" (did you mean {' or '.join(shown)}?)"


def is_model_input(text: str) -> bool:
    """Whether ``text`` names a model the way ``--model`` does (docs/cli.md): a catalog name or
    Hugging Face id, a ``config.json`` or a model directory here. (A served name is none.)"""
    return Path(text).expanduser().exists() or catalog_name(text) is not None


@cache
def _list_models() -> tuple[tuple[str, str, str], ...]:
    rows = []
    for name, path in catalog().items():
        raw = json.loads(path.read_text())
        prov = raw.get("_provenance")
        hf = raw.get("_hf_model") or (prov.get("hf_model", "") if isinstance(prov, dict) else "")
        rows.append((name, hf, (raw.get("architectures") or ["?"])[0]))
    return tuple(rows)


def list_models() -> list[dict[str, str]]:
    """Catalog entries with the Hugging Face id they come from."""
    return [{"name": n, "hf_model": hf, "architecture": arch} for n, hf, arch in _list_models()]


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
    p = Path(name_or_path).expanduser()
    entry = name_or_path if name_or_path in cat else None
    if entry is None and not p.exists():
        entry = catalog_name(name_or_path)
    if entry is not None:
        cfg_path = cat[entry]
        name = entry
    else:
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
                f"unknown model '{name_or_path}': not a catalog name, Hugging Face id of one, "
                f"file or directory{did_you_mean(name_or_path)}",
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
