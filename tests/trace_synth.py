"""Synthetic torch-profiler Chrome traces for the trace tests: the event shapes Kineto writes
(kernel / cuda_runtime with correlation ids, user_annotation, cpu_op), built step by step."""

from __future__ import annotations

import gzip
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any


@dataclass
class Synth:
    """Builds one rank's trace. ``t`` is the host clock (us); kernels are queued on streams."""

    rank: int | None = None
    world_size: int | None = None
    t: float = 1_000.0
    events: list[dict[str, Any]] = field(default_factory=list)
    meta: dict[str, Any] = field(default_factory=dict)
    _corr: int = 0

    def annotation(self, name: str, ts: float, dur: float, tid: int = 1) -> None:
        self.events.append(
            {"ph": "X", "cat": "user_annotation", "name": name, "pid": 1, "tid": tid,
             "ts": ts, "dur": dur, "args": {}}
        )  # fmt: skip

    def kernel(self, name: str, ts: float, dur: float, stream: int = 7, launch: float | None = None,
               cat: str = "kernel", device: int = 0) -> None:  # fmt: skip
        self._corr += 1
        self.events.append(
            {"ph": "X", "cat": cat, "name": name, "pid": 0, "tid": stream, "ts": ts,
             "dur": dur, "args": {"stream": stream, "correlation": self._corr, "device": device}}
        )  # fmt: skip
        self.events.append(
            {"ph": "X", "cat": "cuda_runtime", "name": "cudaLaunchKernel", "pid": 1, "tid": 1,
             "ts": launch if launch is not None else ts - 5.0, "dur": 2.0,
             "args": {"correlation": self._corr}}
        )  # fmt: skip

    def cpu_op(self, name: str, ts: float, dur: float, tid: int = 1) -> None:
        self.events.append(
            {"ph": "X", "cat": "cpu_op", "name": name, "pid": 1, "tid": tid, "ts": ts,
             "dur": dur, "args": {}}
        )  # fmt: skip

    def gpu_step(self, kernels: list[tuple[str, float]], annotation: str | None,
                 gap: float = 10.0, stream: int = 7) -> float:  # fmt: skip
        """One step: host launches, kernels back to back on ``stream`` after ``gap`` us of
        idle; the annotation (if any) spans the launches. Returns the step's GPU start."""
        start = self.t + gap
        ts = start
        for name, dur in kernels:
            self.kernel(name, ts, dur, stream=stream, launch=self.t + 1.0)
            ts += dur
        if annotation:
            self.annotation(annotation, self.t, 3.0)
        self.t = ts
        return start

    def doc(self) -> dict[str, Any]:
        d: dict[str, Any] = {"schemaVersion": 1, "traceEvents": list(self.events), **self.meta}
        if self.rank is not None:
            d["distributedInfo"] = {"backend": "nccl", "rank": self.rank,
                                    "world_size": self.world_size or 1}  # fmt: skip
        return d

    def write(self, path: Path, gz: bool = False) -> Path:
        data = json.dumps(self.doc()).encode()
        path.write_bytes(gzip.compress(data) if gz else data)
        return path


#: a decode step's kernels as an H200 vLLM trace names them (names at their real length)
BIG_STEP = [
    ("void vllm::fused_add_rms_norm_kernel<c10::BFloat16, 8>(c10::BFloat16*, c10::BFloat16*, "
     "c10::BFloat16 const*, float, int, int)", 3.0),
    ("nvjet_tst_64x8_64x16_4x1_v_bz_splitK_TNT", 9.0),
    ("void vllm::rotary_embedding_kernel<c10::BFloat16, true>(long const*, c10::BFloat16*, "
     "c10::BFloat16*, c10::BFloat16 const*, int, long, long, long, int, int, int)", 2.0),
    ("void vllm::reshape_and_cache_flash_kernel<__nv_bfloat16, __nv_bfloat16, "
     "(vllm::Fp8KVCacheDataType)0>(__nv_bfloat16 const*, __nv_bfloat16 const*, "
     "__nv_bfloat16*, __nv_bfloat16*, long const*, int, int, int, int, int, int, float const*, "
     "float const*)", 2.0),
    ("void flash_fwd_splitkv_kernel<Flash_fwd_kernel_traits<128, 64, 128, 4, false, false, "
     "cutlass::bfloat16_t, Flash_kernel_traits<128, 64, 128, 4, cutlass::bfloat16_t> >, "
     "false, false, false, false, true, true, false, false>(Flash_fwd_params)", 8.0),
    ("nvjet_tst_64x8_64x16_4x1_v_bz_TNT", 5.0),
    ("ncclDevKernel_AllReduce_Sum_bf16_RING_LL(ncclDevKernelArgsStorage<4096ul>)", 12.0),
    ("void vllm::act_and_mul_kernel<c10::BFloat16, &(c10::BFloat16 vllm::silu_kernel"
     "<c10::BFloat16>(c10::BFloat16 const&)), true>(c10::BFloat16*, c10::BFloat16 const*, int)",
     2.0),
]  # fmt: skip
BIG_LAYERS = 32
BIG_GAP_US = 40.0


def big_trace(path: Path, target_bytes: int) -> tuple[int, float, float]:
    """A gzipped vLLM-shaped GPU trace of about ``target_bytes`` of JSON, written as text (a
    dict per event through json.dumps would take longer than the reading it tests). Returns
    (steps, step us, kernel us per step) of what it wrote."""
    layer_us = sum(d for _, d in BIG_STEP)
    step_us = BIG_LAYERS * layer_us + BIG_GAP_US
    names = [json.dumps(n) for n, _ in BIG_STEP]
    written, corr, steps, t = 0, 0, 0, 1_000_000.0
    with gzip.open(path, "wt", compresslevel=1) as fh:
        fh.write('{"schemaVersion": 1, "vllm_version": "\\"0.32.0\\"", "traceEvents": [\n')
        first = True
        while written < target_bytes:
            host = t - 30.0
            ann = ('{"ph": "X", "cat": "user_annotation", "name": '
                   '"execute_context_0(0)_generation_1(1)", "pid": 7, "tid": 7, '
                   f'"ts": {host:.3f}, "dur": 25.0, "args": {{"External id": {corr}}}}}')  # fmt: skip
            chunk = [ann]
            ts = t
            for _ in range(BIG_LAYERS):
                for (_, d), name in zip(BIG_STEP, names, strict=True):
                    corr += 1
                    chunk.append(
                        f'{{"ph": "X", "cat": "kernel", "name": {name}, "pid": 0, "tid": 7, '
                        f'"ts": {ts:.3f}, "dur": {d:.3f}, "args": {{"External id": {corr}, '
                        f'"queued": 0, "device": 0, "context": 1, "stream": 7, '
                        f'"correlation": {corr}, "registers per thread": 128, '
                        f'"shared memory": 0, "blocks per SM": 1.5, "warps per SM": 6.0, '
                        f'"grid": [132, 1, 1], "block": [128, 1, 1], '
                        f'"est. achieved occupancy %": 9}}}}'
                    )  # fmt: skip
                    chunk.append(
                        f'{{"ph": "X", "cat": "cuda_runtime", "name": "cudaGraphLaunch", '
                        f'"pid": 7, "tid": 7, "ts": {host + 1:.3f}, "dur": 1.0, '
                        f'"args": {{"External id": {corr}, "cbid": 311, "correlation": {corr}}}}}'
                    )  # fmt: skip
                    ts += d
            text = ("" if first else ",\n") + ",\n".join(chunk)
            first = False
            fh.write(text)
            written += len(text)
            steps += 1
            t += step_us
        fh.write("\n]}\n")
    return steps, step_us, step_us - BIG_GAP_US
