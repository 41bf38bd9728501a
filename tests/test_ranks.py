"""probe.ranks: a multi-rank run always ends with a record. Real gloo process groups, 2 ranks on
the CPU: a rank that hangs before a collective leaves its peer blocked inside it (the shape of
issue 10's TP >= 2 hang), a rank that dies leaves its peer waiting forever. Both must come back
as data (stage, exit code, stacks), within the time limit, with no rank left running."""

from __future__ import annotations

import os
import sys
import textwrap

import pytest

pytest.importorskip("torch")

from ceiling.probe.ranks import run_ranks

WORKER = textwrap.dedent(
    """
    import os, sys, time
    from ceiling.probe.rankstage import arm, stage
    arm()
    stage("import torch")
    import torch, torch.distributed as dist
    mode, rank = sys.argv[1], int(os.environ["RANK"])
    stage("init")
    if rank == 1 and mode == "crash":
        raise RuntimeError("boom on rank 1")  # rank 0 waits for it in the rendezvous, forever
    dist.init_process_group("gloo")
    stage("before allreduce")
    if rank == 1 and mode == "hang":
        time.sleep(3600)
    stage("allreduce")
    dist.all_reduce(torch.ones(4))
    print("PROGRESS 1 1", flush=True)
    dist.destroy_process_group()
    stage("done")
    """
)


def test_a_hung_rank_and_its_blocked_peer_are_reported_with_stage_and_stack():
    # the dumps are awaited (each log grew, then went quiet), not slept for: a generous bound
    # on the wait costs nothing when they land at once
    out = run_ranks([sys.executable, "-c", WORKER, "hang"], 2, {}, timeout_s=20, dump_wait_s=20)
    assert out.timed_out and not out.ok
    r0, r1 = out.ranks
    assert r0.stopped and r0.code is None and r0.stage == "allreduce"
    assert r1.stopped and r1.code is None and r1.stage == "before allreduce"
    # every thread's stack, from faulthandler, is in the last words: where each one stood
    assert any("all_reduce" in ln for ln in r0.last_words)
    assert any("<string>" in ln and "File" in ln for ln in r1.last_words)
    text = out.describe()
    assert "timed out" in text and "rank1" in text and "before allreduce" in text
    # the time limit held although rank 0 printed nothing, and the stacks took no 20 s to land
    assert out.waited_s < 20 + 10, out.waited_s


def test_a_dead_rank_ends_the_run_after_the_grace_period_not_the_time_limit():
    seen = []
    out = run_ranks(
        [sys.executable, "-c", WORKER, "crash"],
        2,
        {},
        timeout_s=300,
        on_line=seen.append,
        peer_grace_s=3,
        dump_wait_s=2,
    )
    assert not out.timed_out and not out.ok
    r0, r1 = out.ranks
    assert r1.code == 1 and not r1.stopped and "boom on rank 1" in r1.summary()
    assert r0.stopped and r0.stage == "init"
    assert any("init_process_group" in ln for ln in r0.last_words)
    assert out.waited_s < 60
    assert seen == []  # rank 0 never got past the collective


def test_a_good_run_passes_rank0_lines_and_is_ok(tmp_path):
    seen = []
    out = run_ranks(
        [sys.executable, "-c", WORKER, "ok"], 2, {}, 120, on_line=seen.append, keep_logs=tmp_path
    )
    assert out.ok, out.describe()
    assert seen == ["PROGRESS 1 1"]
    assert [r.stage for r in out.ranks] == ["done", "done"]
    assert sorted(os.listdir(tmp_path)) == ["rank0.log", "rank1.log"]
