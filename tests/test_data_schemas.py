"""Every YAML data file that ships inside ceiling has a schema, loads through it, and a misspelled
key fails at load with the file and the key named (instead of silently becoming a default)."""

from __future__ import annotations

import ast
from importlib import resources
from pathlib import Path

import pytest
import yaml
from pydantic import BaseModel
from validation.accounting import ValidationLedger
from validation.batch_validation import SiliconMap

from ceiling.engines.tables import DeathCausesFile, NcclEnvFile, RemovedFlagsFile
from ceiling.engines.trace_patterns import PatternTable
from ceiling.envcheck.envdata import EnvFile, LoadErrorsFile
from ceiling.errors import CeilingError
from ceiling.predict.datafiles import Constants, KernelPriorsFile, KernelsFile
from ceiling.predict.engine_options import TrtllmOptions
from ceiling.predict.gguf import LlamaCppKernelsFile
from ceiling.predict.gguf_mix import GgufMixesFile
from ceiling.predict.interval import IntervalsFile
from ceiling.predict.ladder import Ladder
from ceiling.predict.specdec import SpecData
from ceiling.probe.calibrate import CalibrateFile
from ceiling.probe.cpu_host import CpuHostFile
from ceiling.probe.ranks import CommbenchFile
from ceiling.probe.topology_parse import PcieFile
from ceiling.sanity.spec import SanitySpec
from ceiling.spec._data import load_yaml, validate_data
from ceiling.spec.checks import Validity
from ceiling.spec.deployment import EnginesFile
from ceiling.spec.hardware import GpuCatalog, LinkCatalog
from ceiling.trace.split import ClassesFile

ROOT = Path(str(resources.files("ceiling")))

# file (under src/ceiling) -> (its schema, the key path one misspelling is tried at)
SCHEMAS: dict[str, tuple[type[BaseModel], tuple[str | int, ...]]] = {
    "data/calibrate.yaml": (CalibrateFile, ("gpu", "gemv_GiB")),
    "data/commbench.yaml": (CommbenchFile, ("always_env",)),
    "data/cpu_host.yaml": (CpuHostFile, ("measure", "read_bytes")),
    "data/env.yaml": (EnvFile, ("shm", "nccl_channels")),
    "data/gpus.yaml": (GpuCatalog, ("h200", "mem_bw_GBps")),
    "data/links.yaml": (LinkCatalog, ("nvlink4", "nccl", "hop_us")),
    "data/pcie.yaml": (PcieFile, ("generations", 5, "gt_per_s")),
    "data/predict/constants.yaml": (Constants, ("bound_op_us",)),
    "data/predict/engines.yaml": (EnginesFile, ("vllm", "host_ms")),
    "data/predict/evidence.yaml": (Ladder, ("table_check", "max_ratio")),
    "data/predict/gguf_mixes.yaml": (GgufMixesFile, ("mixes", "q4_k_m", "default")),
    "data/predict/intervals.yaml": (IntervalsFile, ("levels", "table", "sigma")),
    "data/predict/kernel_priors.yaml": (
        KernelPriorsFile,
        ("classes", "hopper", "gemm_bf16", "t0_us"),
    ),
    "data/predict/kernels.yaml": (
        KernelsFile,
        ("tp_layer_collectives", "MiniMaxM2ForCausalLM", "kernels"),
    ),
    "data/predict/reference/validation_sets.yaml": (ValidationLedger, ("sets", 0, "added")),
    "data/predict/silicon_map.yaml": (SiliconMap, ("models", "Qwen/Qwen3-32B", "native")),
    "data/predict/spec_decode.yaml": (SpecData, ("methods", "mtp", "alpha")),
    "data/predict/trtllm_options.yaml": (TrtllmOptions, ("options", "allreduce_strategy", "knob")),
    "data/predict/validity.yaml": (Validity, ("model_max",)),
    "data/sanity.yaml": (SanitySpec, ("perplexity",)),
    "data/trace/classes.yaml": (ClassesFile, ("classes", "gemm", "group")),
    "engines/data/death_causes.yaml": (DeathCausesFile, ("rules", 0, "pattern")),
    "engines/data/llamacpp_kernels.yaml": (LlamaCppKernelsFile, ("priors", "matvec_eff")),
    "engines/data/nccl_env.yaml": (NcclEnvFile, ("values", "NCCL_ALGO", "list")),
    "engines/data/trace/generic.yaml": (PatternTable, ("patterns", 0, "op_class")),
    "engines/data/trace/llamacpp.yaml": (PatternTable, ("patterns", 0, "op_class")),
    "engines/data/trace/sglang.yaml": (PatternTable, ("patterns", 0, "op_class")),
    "engines/data/trace/vllm.yaml": (PatternTable, ("patterns", 0, "op_class")),
    "engines/data/vllm_removed_flags.yaml": (RemovedFlagsFile, ("flags", "swap-space", "reason")),
    "envcheck/data/load_errors.yaml": (LoadErrorsFile, ("rules", 0, "match")),
}


def _split(rel: str) -> tuple[str, str]:
    """(folder, relpath) as load_yaml takes them."""
    for folder in ("engines/data", "envcheck/data", "data"):
        if rel.startswith(folder + "/"):
            return folder, rel[len(folder) + 1 :]
    raise AssertionError(rel)


def test_every_shipped_yaml_file_has_a_schema():
    shipped = {str(p.relative_to(ROOT)) for p in ROOT.rglob("*.yaml")}
    assert shipped == set(SCHEMAS), "a YAML data file without a schema (add it here and a schema)"


@pytest.mark.parametrize("rel", sorted(SCHEMAS))
def test_file_loads_through_its_schema(rel):
    folder, relpath = _split(rel)
    schema, _ = SCHEMAS[rel]
    assert isinstance(load_yaml(relpath, folder, schema=schema), schema)


def _misspell(key: str) -> str:
    """host_ms -> hots_ms: two letters swapped (the kind of typo that used to read as 0)."""
    i = next(i for i in range(1, len(key) - 1) if key[i] != key[i + 1] and key[i].isalpha())
    return key[:i] + key[i + 1] + key[i] + key[i + 2 :]


@pytest.mark.parametrize("rel", sorted(SCHEMAS))
def test_a_misspelled_key_fails_at_load_naming_file_and_key(rel):
    schema, path = SCHEMAS[rel]
    data = yaml.safe_load((ROOT / rel).read_text(encoding="utf-8"))
    node = data
    for part in path[:-1]:
        node = node[part]
    key = path[-1]
    assert isinstance(key, str) and key in node, f"{rel}: {path} is not in the file"
    wrong = _misspell(key)
    node[wrong] = node.pop(key)
    with pytest.raises(CeilingError) as err:
        validate_data(data, schema, rel)
    assert rel in err.value.message and wrong in err.value.message


def test_the_misspelling_of_host_ms_is_caught():
    """The issue's example: engines.yaml's host_ms spelled hots_ms used to read as 0 ms."""
    data = yaml.safe_load((ROOT / "data/predict/engines.yaml").read_text(encoding="utf-8"))
    data["sglang"]["hots_ms"] = data["sglang"].pop("host_ms")
    with pytest.raises(CeilingError, match=r"engines\.yaml: sglang\.hots_ms"):
        validate_data(data, EnginesFile, "data/predict/engines.yaml")


def test_a_missing_required_key_fails_too():
    data = yaml.safe_load((ROOT / "data/predict/constants.yaml").read_text(encoding="utf-8"))
    del data["compute_efficiency"]
    with pytest.raises(CeilingError, match="compute_efficiency: Field required"):
        validate_data(data, Constants, "data/predict/constants.yaml")


def _load_yaml_calls() -> list[tuple[str, int, ast.Call]]:
    calls = []
    for path in sorted(ROOT.rglob("*.py")):
        tree = ast.parse(path.read_text(encoding="utf-8"), str(path))
        for node in ast.walk(tree):
            if isinstance(node, ast.Call):
                f = node.func
                name = f.id if isinstance(f, ast.Name) else getattr(f, "attr", None)
                if name == "load_yaml":
                    calls.append((str(path.relative_to(ROOT)), node.lineno, node))
    return calls


def test_every_load_yaml_call_passes_its_schema():
    """A call without ``schema=`` reads the file raw: a misspelled key becomes a silent default
    again (spec/checks.py read validity.yaml that way). The scan sees every call in the source,
    including ones no test reaches."""
    calls = _load_yaml_calls()
    assert "spec/checks.py" in {rel for rel, _, _ in calls}, "the scan missed a known call"
    raw = [
        f"{rel}:{line}"
        for rel, line, call in calls
        if not any(kw.arg == "schema" for kw in call.keywords)
    ]
    assert not raw, f"load_yaml without schema=: {raw}"
