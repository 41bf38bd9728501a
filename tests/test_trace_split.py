"""ceiling.trace: reading torch-profiler traces and splitting their steps by op class."""

from __future__ import annotations

import pytest
from tests.trace_synth import Synth

from ceiling.errors import CeilingError
from ceiling.trace import read_trace, split

DECODE = "execute_context_0(0)_generation_1(1)"
STEP = [
    ("ampere_bf16_s16816gemm_bf16_64x64_ldg8_f2f_tn", 40.0),
    ("void vllm::rms_norm_kernel<c10::BFloat16, 8, 4>(...)", 5.0),
    ("void flash_fwd_splitkv_kernel<Flash_fwd_kernel_traits<128, 64, 128, 4>>(...)", 20.0),
    ("ncclDevKernel_AllReduce_Sum_bf16_RING_LL(ncclDevKernelArgsStorage<4096ul>)", 15.0),
    ("void at::native::reduce_kernel<512, 1, at::native::ReduceOp<float, at::native::ArgMaxOps<float>>>", 4.0),
]  # fmt: skip


def _steps(s: Synth, n: int, gap: float = 10.0, annotate: str | None = DECODE) -> None:
    for _ in range(n):
        s.gpu_step(STEP, annotate, gap=gap)


def test_classes_plus_idle_equal_the_step(tmp_path):
    s = Synth()
    _steps(s, 5, gap=16.0)
    out = split([read_trace(s.write(tmp_path / "t.json"))], "vllm")
    assert out.steps == 4  # the last step's end is the next step's start: not recorded
    assert out.step_ms == pytest.approx((84 + 16) / 1e3)
    assert out.idle_ms == pytest.approx(16 / 1e3)
    assert sum(c.ms for c in out.classes) + out.idle_ms == pytest.approx(out.step_ms)
    for st in out.per_step:
        assert st.busy_ms + st.idle_ms == pytest.approx(st.ms)
    got = {c.op_class: c.ms for c in out.classes}
    assert got == pytest.approx(
        {"gemm": 0.040, "norm": 0.005, "attention": 0.020, "allreduce": 0.015, "sampling": 0.004}
    )
    ar = next(c for c in out.classes if c.op_class == "allreduce")
    assert ar.impl == ["nccl_ring_ll"]
    assert out.coverage == 1.0 and out.unmatched == []
    assert out.step_source.startswith("vLLM execute_context")


def test_unmatched_kernels_are_listed_by_name(tmp_path):
    s = Synth()
    for _ in range(3):
        s.gpu_step([*STEP, ("my_secret_kernel_xyz", 6.0)], DECODE)
    out = split([read_trace(s.write(tmp_path / "t.json"))], "vllm")
    assert [u.name for u in out.unmatched] == ["my_secret_kernel_xyz"]
    assert out.unmatched[0].ms == pytest.approx(0.006)
    assert out.unmatched[0].count == 1
    assert out.coverage == pytest.approx(1 - 6 / 90, abs=1e-4)


def test_overlapping_streams_count_wall_time_once(tmp_path):
    s = Synth()
    for _ in range(4):
        start = s.gpu_step(STEP, DECODE, gap=10.0)
        # the shared expert on a second stream, half of it under the main stream's GEMM
        s.kernel("fused_moe_kernel", start + 20.0, 40.0, stream=24, launch=start - 9)
        s.t = max(s.t, start + 60.0)
    out = split([read_trace(s.write(tmp_path / "t.json"))], "vllm")
    for st in out.per_step:
        assert st.busy_ms + st.idle_ms == pytest.approx(st.ms)
    # the side kernel ran 40 us, all of it while the main stream was busy (84 us of kernels)
    assert out.class_ms("moe_experts") == pytest.approx(0.0)
    note = next(o for o in out.overlap if o.op_class == "moe_experts")
    assert note.stream == 24 and note.hidden_ms == pytest.approx(0.040)
    assert note.top_kernels == ["fused_moe_kernel"]
    assert out.busy_ms == pytest.approx(0.084)


def test_side_stream_beyond_the_main_stream_counts_its_own_part(tmp_path):
    s = Synth()
    for _ in range(4):
        start = s.gpu_step(STEP, DECODE, gap=30.0)
        s.kernel("fused_moe_kernel", start + 70.0, 24.0, stream=24, launch=start - 29)
        s.t = start + 94.0
    out = split([read_trace(s.write(tmp_path / "t.json"))], "vllm")
    assert out.class_ms("moe_experts") == pytest.approx(0.010)  # 84..94 us: main idle
    assert sum(c.ms for c in out.classes) + out.idle_ms == pytest.approx(out.step_ms)


def test_a_window_starting_mid_step_drops_the_partial_step(tmp_path):
    s = Synth()
    starts = [s.gpu_step(STEP, DECODE) for _ in range(5)]
    t = read_trace(s.write(tmp_path / "t.json"))
    whole = split([t], "vllm")
    cut = split([t], "vllm", window=(starts[1] + 30.0, s.t + 1))
    assert cut.steps == whole.steps - 2  # the cut one and the partial one are gone
    # host-bound steps begin at their annotation (the host's turn), 10 us before the kernels
    assert cut.per_step[0].start_us == pytest.approx(starts[2] - 10.0)
    assert any("partial" in k for k in cut.steps_skipped)
    assert cut.step_ms == pytest.approx(whole.step_ms)


def test_prefill_steps_are_left_out(tmp_path):
    s = Synth()
    s.gpu_step(STEP * 3, "execute_context_1(512)_generation_0(0)")
    _steps(s, 4)
    out = split([read_trace(s.write(tmp_path / "t.json"))], "vllm")
    assert out.steps == 3
    assert out.steps_skipped["prefill (context requests in the step)"] == 1


def test_profiler_step_annotations_and_periodic_structure(tmp_path):
    s = Synth()
    for i in range(5):
        s.gpu_step(STEP, f"ProfilerStep#{i}", gap=12.0)
    out = split([read_trace(s.write(tmp_path / "a.json"))], None)
    assert out.step_source.startswith("ProfilerStep#N") and out.steps == 4
    s2 = Synth()
    s2.kernel("ampere_bf16_s16816gemm_bf16_64x64_ldg8_f2f_tn", 900.0, 30.0)  # a partial step
    _steps(s2, 6, gap=12.0, annotate=None)
    per = split([read_trace(s2.write(tmp_path / "b.json"))], None)
    assert per.step_source.startswith("periodic")
    assert per.step_ms == pytest.approx(out.step_ms)


def test_gzipped_trace_reads_the_same(tmp_path):
    s = Synth()
    _steps(s, 4)
    a = split([read_trace(s.write(tmp_path / "t.json"))], "vllm")
    b = split([read_trace(s.write(tmp_path / "t.json.gz", gz=True))], "vllm")
    assert a.model_dump(exclude={"ranks"}) == b.model_dump(exclude={"ranks"})


def test_cpu_trace_counts_top_level_operators_once(tmp_path):
    s = Synth()
    t = 100.0
    for _ in range(4):
        s.annotation(DECODE, t, 90.0)
        s.cpu_op("aten::linear", t + 5, 40.0)
        s.cpu_op("aten::addmm", t + 6, 38.0)  # nested inside aten::linear
        s.cpu_op("_C::rms_norm", t + 50, 10.0)
        s.cpu_op("_C::cpu_attention_with_kv_cache", t + 62, 20.0)
        s.cpu_op("aten::linear", t + 5, 1.0, tid=9)  # another thread: not the step's
        t += 100.0
    tr = read_trace(s.write(tmp_path / "cpu.json"))
    assert tr.device == "cpu" and tr.nested_ops_skipped == 4
    out = split([tr], "vllm")
    assert out.steps == 3 and out.step_ms == pytest.approx(0.100)
    assert {c.op_class: c.ms for c in out.classes} == pytest.approx(
        {"gemm": 0.040, "norm": 0.010, "attention": 0.020}
    )
    assert out.idle_ms == pytest.approx(0.030)
    assert any("other thread" in n for n in out.notes)


def _rank(rank: int, ar_durs: list[float], world: int = 2) -> Synth:
    s = Synth(rank=rank, world_size=world)
    for d in ar_durs:
        s.gpu_step(
            [("ampere_bf16_s16816gemm_bf16_64x64_ldg8_f2f_tn", 40.0),
             ("ncclDevKernel_AllReduce_Sum_bf16_RING_LL(x)", d),
             ("ampere_bf16_s16816gemm_bf16_64x64_ldg8_f2f_tn", 40.0 + 15 - d)],
            DECODE,
        )  # fmt: skip
    return s


def test_ranks_wait_inside_collectives_apart_from_transfer(tmp_path):
    # rank 0 arrives early at every allreduce and waits 10 us; rank 1 is the late one
    r0 = read_trace(_rank(0, [15.0] * 5).write(tmp_path / "r0.json"))
    r1 = read_trace(_rank(1, [5.0] * 5).write(tmp_path / "r1.json"))
    out = split([r0, r1], "vllm")
    assert [r.rank for r in out.ranks] == [0, 1]
    w = {r.rank: r.collective_wait_ms for r in out.ranks}
    assert w[0] == pytest.approx(0.010) and w[1] == pytest.approx(0.0)
    assert out.slowest_rank == 1  # the late one: the others wait for it
    ar = next(c for c in out.classes if c.op_class == "allreduce")
    head = next(r for r in out.ranks if r.rank == out.slowest_rank)
    assert ar.ms == pytest.approx(head.classes["allreduce"])
    assert ar.wait_ms + ar.transfer_ms == pytest.approx(ar.ms)
    assert out.rank_spread_pct is not None and out.missing_ranks == []
    (cw,) = out.collective_waits
    assert cw.op_class == "allreduce" and cw.transfer_ms == pytest.approx(0.005)
    assert cw.wait_ms_mean == pytest.approx(0.005) and cw.wait_ms_max == pytest.approx(0.010)
    assert cw.most_waiting_rank == 0
    assert "allreduce: 0.010 ms of the" in out.headline
    assert (
        "of which 0.005 ms waiting for the slowest rank (up to 0.010 ms on rank 0)" in out.headline
    )


def test_a_missing_rank_is_said(tmp_path):
    r0 = read_trace(_rank(0, [15.0] * 4, world=4).write(tmp_path / "r0.json"))
    r2 = read_trace(_rank(2, [15.0] * 4, world=4).write(tmp_path / "r2.json"))
    out = split([r0, r2], "vllm")
    assert out.missing_ranks == [1, 3]
    assert any("have no trace" in n for n in out.notes)


def test_bad_inputs_are_one_line_errors(tmp_path):
    with pytest.raises(CeilingError, match="not found"):
        read_trace(tmp_path / "nope.json")
    (tmp_path / "bad.json").write_text("{not json")
    with pytest.raises(CeilingError, match="not JSON"):
        read_trace(tmp_path / "bad.json")
    (tmp_path / "obj.json").write_text('{"a": 1}')
    with pytest.raises(CeilingError, match="traceEvents"):
        read_trace(tmp_path / "obj.json")
    (tmp_path / "cut.json.gz").write_bytes(b"\x1f\x8b\x08\x00garbage")
    with pytest.raises(CeilingError, match="gzip"):
        read_trace(tmp_path / "cut.json.gz")
    s = Synth()
    s.gpu_step(STEP, None)
    with pytest.raises(CeilingError, match="no complete decode step"):
        split([read_trace(s.write(tmp_path / "one.json"))], "vllm")
    a = read_trace(_rank(0, [15.0] * 3).write(tmp_path / "a.json"))
    with pytest.raises(CeilingError, match="claim rank 0"):
        split([a, a], "vllm")


def test_a_gzipped_100mb_trace_parses_and_splits_right(tmp_path):
    from tests.trace_synth import BIG_GAP_US, big_trace

    path = tmp_path / "big.json.gz"
    steps, step_us, busy_us = big_trace(path, 100 * 2**20)
    out = split([read_trace(path)], None)  # the engine is read from the trace (vllm_version)
    assert out.engine == "vllm" and out.engine_version == "0.32.0"
    assert out.steps == steps - 1
    assert out.step_ms == pytest.approx(step_us / 1e3, rel=1e-6)
    assert out.idle_ms == pytest.approx(BIG_GAP_US / 1e3, rel=1e-4)
    assert out.busy_ms == pytest.approx(busy_us / 1e3, rel=1e-6)
    assert out.coverage == 1.0
    assert out.class_ms("allreduce") == pytest.approx(32 * 12.0 / 1e3, rel=1e-6)
    assert {c.op_class for c in out.classes} == {
        "norm", "gemm", "rope", "kv_write", "attention", "allreduce", "activation"
    }  # fmt: skip


def test_the_founding_sentence_counts_the_waiting_of_the_mean_rank(tmp_path):
    from ceiling.trace.measured import measured_split

    r0 = read_trace(_rank(0, [15.0] * 5).write(tmp_path / "r0.json"))
    r1 = read_trace(_rank(1, [5.0] * 5).write(tmp_path / "r1.json"))
    ms = measured_split(split([r0, r1], "vllm"), None)
    # rank 0 spends 15 us per step in the allreduce, rank 1 5 us: 5 us moving data, rank 0
    # 10 us waiting for rank 1 -> the mean rank: 10 us, of which 5 us waiting
    assert ms.allreduce_ms == pytest.approx(0.010) and ms.allreduce_wait_ms == pytest.approx(0.005)
    assert "of which 0.005 ms is waiting for the slowest rank" in ms.allreduce_sentence()


def test_one_process_driving_two_gpus_is_two_ranks(tmp_path):
    s = Synth()
    for _ in range(5):
        s.annotation(DECODE, s.t, 3.0)
        start = s.t + 10.0
        for dev, ar in ((0, 15.0), (1, 5.0)):  # GPU 0 waits 10 us for GPU 1 at the allreduce
            ts = start
            for name, d in [("nvjet_tst_64x8_64x16_4x1_v_bz_TNT", 40.0),
                            ("ncclDevKernel_AllReduce_Sum_bf16_RING_LL(x)", ar),
                            ("nvjet_tst_64x8_64x16_4x1_v_bz_TNT", 55.0 - ar)]:  # fmt: skip
                s.kernel(name, ts, d, stream=7, launch=s.t + 1.0, device=dev)
                ts += d
        s.t = start + 95.0
    out = split([read_trace(s.write(tmp_path / "one_process.json"))], "vllm")
    assert [r.rank for r in out.ranks] == [0, 1]
    assert all(r.steps == 4 for r in out.ranks)
    assert {r.rank: r.collective_wait_ms for r in out.ranks} == pytest.approx({0: 0.010, 1: 0.0})
    assert out.busy_ms == pytest.approx(0.095)  # one GPU's kernels, not the two merged
