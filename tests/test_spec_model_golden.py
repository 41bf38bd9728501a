"""Every catalog model (and every architecture the catalog lacks, derived from one) builds to
exactly the ModelSpec recorded in ``tests/data/spec/model_golden.json``.

The golden file was written by the one-function ``build_model`` before it was split into one
module per model family (issue 14): a refactor of the builder must not move a single module,
shape, format or byte. Regenerate it only for an intended change of the model:
``python tests/test_spec_model_golden.py --write``.
"""

from __future__ import annotations

import copy
import dataclasses
import hashlib
import json
import sys
from pathlib import Path
from typing import Any

import ceiling
from ceiling.spec.model import ModelSpec, build_model, catalog, load_model
from ceiling.spec.quant import named_format

GOLDEN = Path(__file__).parent / "data" / "spec" / "model_golden.json"
PACKAGE = Path(ceiling.__file__).parent


def _derived(name: str, arch: str, **changes: Any) -> dict[str, Any]:
    """A catalog config relabelled as another architecture of the same structure."""
    raw = json.loads(catalog()[name].read_text())
    raw = copy.deepcopy(raw.get("text_config", raw)) if "text_config" in raw else raw
    raw["architectures"] = [arch]
    raw.update(changes)
    return raw


def _cases() -> dict[str, ModelSpec]:
    out = {name: load_model(name) for name in catalog()}
    # architectures the catalog has no config of: same structure, their own names/branches
    out["derived:mistral"] = build_model(_derived("llama-3.1-8b", "MistralForCausalLM"))
    out["derived:deepseek-v2"] = build_model(
        _derived("deepseek-v3", "DeepseekV2ForCausalLM", q_lora_rank=None)
    )
    out["derived:qwen2-moe"] = build_model(
        _derived("qwen3-30b-a3b", "Qwen2MoeForCausalLM", shared_expert_intermediate_size=2048)
    )
    out["derived:qwen3-next"] = build_model(
        _derived("qwen3.5-397b-a17b", "Qwen3NextForCausalLM", layer_types=None)
    )
    out["derived:qwen3-moe-sparse-step"] = build_model(
        _derived("qwen3-30b-a3b", "Qwen3MoeForCausalLM", decoder_sparse_step=2, mlp_only_layers=[5])
    )
    out["derived:moe-layer-freq"] = build_model(
        _derived("deepseek-v3", "DeepseekV3ForCausalLM", moe_layer_freq=2)
    )
    out["derived:sliding-off"] = build_model(
        _derived("gpt-oss-120b", "GptOssForCausalLM", use_sliding_window=False)
    )
    out["override:llama-70b-fp8"] = load_model("llama-3.1-70b", named_format("fp8"))
    out["override:kimi-nvfp4"] = load_model("kimi-k2.5", named_format("nvfp4"))
    return out


def _dump(spec: ModelSpec) -> dict[str, Any]:
    """Every field; the scheme's rules are closures, so the scheme is given by its plain fields
    (what each rule did is in every module's ``fmt`` and ``nbytes``)."""
    q = spec.quant
    scheme = {
        "method": q.method,
        "summary": q.summary,
        "default": dataclasses.asdict(q.default),
        "kv_cache_dtype": q.kv_cache_dtype,
        "ignore": q.ignore.patterns,
    }
    fields = {f.name: getattr(spec, f.name) for f in dataclasses.fields(spec) if f.name != "quant"}
    # the config's path relative to the package: the digest must not depend on the checkout
    fields["source"] = str(fields["source"]).replace(str(PACKAGE), "<ceiling>")
    return {**json.loads(json.dumps(fields, default=_plain)), "quant": scheme}


def _plain(obj: Any) -> Any:
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        return dataclasses.asdict(obj)
    raise TypeError(f"unexpected {type(obj).__name__} in a ModelSpec")


def digest(spec: ModelSpec) -> dict[str, Any]:
    text = json.dumps(_dump(spec), sort_keys=True)
    return {
        "sha256": hashlib.sha256(text.encode()).hexdigest(),
        "modules": len(spec.modules),
        "total_params": spec.total_params(),
        "weight_bytes": spec.weight_bytes(),
        "kv_bytes_per_token_1": spec.kv_bytes_per_token(1),
    }


def test_every_model_builds_to_the_recorded_spec():
    golden = json.loads(GOLDEN.read_text())
    built = {name: digest(spec) for name, spec in _cases().items()}
    assert sorted(built) == sorted(golden)
    # the totals first: a mismatch there says what moved; the digest then catches the rest
    totals = {n: {k: v for k, v in d.items() if k != "sha256"} for n, d in built.items()}
    assert totals == {n: {k: v for k, v in d.items() if k != "sha256"} for n, d in golden.items()}
    moved = [n for n in built if built[n]["sha256"] != golden[n]["sha256"]]
    assert not moved, f"same totals, another module list or field: {moved}"


if __name__ == "__main__" and "--write" in sys.argv:
    GOLDEN.write_text(
        json.dumps({k: digest(v) for k, v in sorted(_cases().items())}, indent=1) + "\n"
    )
    print(f"wrote {GOLDEN}")
