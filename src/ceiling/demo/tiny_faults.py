"""Copies of the tiny trained model, each served *wrongly* in one way: what ``ceiling sanity``
must call broken.

Run it with the engine's Python (it needs torch, safetensors and tokenizers)::

    .engines/vllm/bin/python src/ceiling/demo/tiny_faults.py MODEL_DIR OUT_DIR [FAULT ...]

MODEL_DIR is a built tiny model (``tiny_model.py``); each fault becomes ``OUT_DIR/<fault>``, a
full copy of the model with one thing changed, and ``fault.json`` saying what. The weights are
the same weights; what changes is how a server would compute with them:

- ``norm-eps``: ``rms_norm_eps`` 1e-5 -> 1e-2 in the served config (a misread or mistyped
  config value);
- ``swapped-v-heads``: layer 0's ``v_proj`` with its two halves (one per attention head)
  exchanged: what loading two tensor-parallel shards of one projection in the wrong order does;
- ``sibling-tokenizer``: the tokenizer of a sibling model (the same trainer and corpus, 400
  tokens instead of 512): most ids mean other text;
- ``rope-theta``: ``rope_theta`` 10000 -> 100 in the served config. Measured (transformers and
  vLLM, CPU): this 2-layer model, trained on short lines, barely uses positions, so the change
  leaves its answers right (perplexity 1.04 either way): sanity rightly calls it ok. Kept as a
  documented non-fault, not in the default set.

This file must not import anything from ceiling: it runs outside ceiling's environment.
"""

from __future__ import annotations

import json
import shutil
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from tiny_model import build_tokenizer, is_current

FAULTS = ("norm-eps", "swapped-v-heads", "sibling-tokenizer")
ALL_FAULTS = (*FAULTS, "rope-theta")
FORMAT = 1  # raise when a fault's recipe changes


def _config(out: Path, key: str, value: object) -> str:
    path = out / "config.json"
    cfg = json.loads(path.read_text())
    if key == "rope_theta" and isinstance(cfg.get("rope_parameters"), dict):
        old = cfg["rope_parameters"].get("rope_theta")
        cfg["rope_parameters"]["rope_theta"] = value
    else:
        old = cfg.get(key)
        cfg[key] = value
    path.write_text(json.dumps(cfg, indent=2) + "\n")
    return f"config.json {key}: {old} -> {value}"


def _swap_v_heads(out: Path) -> str:
    import torch
    from safetensors.torch import load_file, save_file

    path = out / "model.safetensors"
    tensors = load_file(str(path))
    name = "model.layers.0.self_attn.v_proj.weight"
    w = tensors[name]
    half = w.shape[0] // 2
    tensors[name] = torch.cat([w[half:], w[:half]]).contiguous()
    save_file(tensors, str(path), metadata={"format": "pt"})
    return f"{name}: rows [0:{half}] and [{half}:{w.shape[0]}] exchanged (head 0 <-> head 1)"


def _sibling_tokenizer(out: Path) -> str:
    for f in ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json"):
        (out / f).unlink(missing_ok=True)
    size = build_tokenizer(out, vocab_size=400)
    return f"tokenizer retrained with {size} tokens instead of 512 (same trainer and corpus)"


def make(model_dir: str | Path, out_dir: str | Path, fault: str) -> Path:
    """``out_dir/<fault>``: the model with that fault (kept when already made from it)."""
    src, out = Path(model_dir), Path(out_dir) / fault
    if not is_current(src):
        raise SystemExit(f"{src} is not a current tiny model: build it with tiny_model.py")
    note = {"fault": fault, "format": FORMAT, "source": str(src.resolve())}
    try:
        if json.loads((out / "fault.json").read_text())["recipe"] == note:
            return out
    except (OSError, ValueError, KeyError):
        pass
    tmp = out.with_name(f"{fault}.tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    shutil.copytree(src, tmp)
    if fault == "norm-eps":
        what = _config(tmp, "rms_norm_eps", 1e-2)
    elif fault == "rope-theta":
        what = _config(tmp, "rope_theta", 100.0)
    elif fault == "swapped-v-heads":
        what = _swap_v_heads(tmp)
    elif fault == "sibling-tokenizer":
        what = _sibling_tokenizer(tmp)
    else:
        raise SystemExit(f"unknown fault {fault!r}: one of {', '.join(ALL_FAULTS)}")
    (tmp / "fault.json").write_text(json.dumps({"recipe": note, "what": what}, indent=2) + "\n")
    shutil.rmtree(out, ignore_errors=True)
    tmp.rename(out)
    return out


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if len(args) < 2:
        print("usage: python tiny_faults.py MODEL_DIR OUT_DIR [FAULT ...]", file=sys.stderr)
        return 2
    for fault in args[2:] or FAULTS:
        print(make(args[0], args[1], fault))
    return 0


if __name__ == "__main__":
    sys.exit(main())
