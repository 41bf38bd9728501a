"""The fixed enumerations of ceiling's inputs, defined once: the libraries validate against these
``Literal`` types and the CLI offers them as choices (``--help`` lists them, shells complete
them). Dependency-free on purpose: the CLI reads it while it starts. Lists that come from data
or adapters (server engines, weight formats, GPUs, links) are read from their own source by
``ceiling.cli``.
"""

from __future__ import annotations

from typing import Literal, get_args

#: Every engine name a command's ``--engine`` takes: one name, one engine, in every command
#: (docs/cli.md). Each command offers the ones it supports: predict the engines it models
#: (``generic``: plain PyTorch + NCCL, no engine's own rules), the adapters the engines they
#: launch and read (``ceiling.engines``), calibrate the engines whose kernels it times.
EngineName = Literal["vllm", "sglang", "trtllm", "llamacpp", "llamacpp-python", "generic"]
#: The engines predict models (``predict --engine``; ``PredictRequest.engine``).
PredictEngine = Literal["vllm", "sglang", "trtllm", "generic", "llamacpp"]
# engines whose own kernels `calibrate --engine` times (llama.cpp: test-backend-ops perf)
CalibrateEngine = Literal["llamacpp"]
#: The speculative decoding method predict models (``predict --spec``; ``PredictRequest.spec``):
#: the checkpoint's MTP layers, an EAGLE/EAGLE-3 draft model, or n-gram prompt lookup.
SpecMethod = Literal["none", "mtp", "eagle", "eagle3", "ngram"]
#: The allreduce implementation predict assumes (``auto``: the engine's own rule).
Allreduce = Literal["auto", "nccl", "oneshot"]
#: The KV-cache dtype predict assumes (``auto``: the model's dtype).
KvDtype = Literal["auto", "bf16", "fp16", "fp8", "fp8_e4m3", "fp8_e5m2"]  # spec.deployment sizes
#: How ``bench`` drives the server (``BenchConfig.mode``).
BenchMode = Literal["single", "concurrency", "rate", "capacity"]
#: How ``bench --dataset`` reads its file (``auto``: ShareGPT when the file is a JSON list of
#: objects with ``conversations``, else JSONL).
DatasetFormat = Literal["auto", "jsonl", "sharegpt"]
#: The element type of ``commbench``'s buffers (``--buffer-dtype``; torch's names).
CommDtype = Literal["float32", "float16", "bfloat16", "float64", "int32", "int64", "int8", "uint8"]
#: The collective backend of ``commbench`` (``auto``: NCCL on GPUs, gloo on the CPU).
CommBackend = Literal["auto", "nccl", "gloo"]


def values(kind: object) -> tuple[str, ...]:
    """The strings of one of the ``Literal`` types above."""
    return tuple(str(v) for v in get_args(kind))
