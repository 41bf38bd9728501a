"""Workloads against the synthetic SSE server: ShareGPT files, lengths within a range, a shared
prefix, multi-turn sessions; each deterministic by seed, each request's length the server's.

The synthetic server's "tokenizer" is one token per whitespace-separated word (``/tokenize`` and
``usage`` alike), so every length below is exact."""

from __future__ import annotations

import itertools
import json
from collections import defaultdict
from pathlib import Path
from typing import Any

import pytest

from ceiling.bench.config import BenchConfig
from ceiling.bench.runner import run_bench
from ceiling.errors import CeilingError
from sse_server import Plan, SSEServer

pytestmark = pytest.mark.timeout(120)

SHAREGPT = Path(__file__).parent / "fixtures" / "sharegpt" / "small.json"


def _cfg(url: str, **kw: object) -> BenchConfig:
    base: dict[str, object] = {"url": url, "max_tokens": 4, "warmup": 0}
    if "dataset" not in kw:  # a dataset brings its own lengths: --input-len is refused then
        base["input_len"] = 12
    base.update(kw)
    return BenchConfig(**base)  # type: ignore[arg-type]


def _run(plan: Plan | None = None, **kw: object) -> tuple[Any, list[dict[str, Any]]]:
    """Run a bench against a fresh server; the result and the request bodies it received."""
    with SSEServer(plan or Plan(ttft_s=0.001, itl_s=0.0005)) as srv:
        res = run_bench(_cfg(srv.url, **kw), progress=False)
        return res, list(srv.bodies)


def _words(text: str) -> list[str]:
    return text.split()


# -- ShareGPT ------------------------------------------------------------------------------------


def _conversations() -> dict[str, tuple[str, str]]:
    """id -> (first human turn, the gpt turn after it) of the fixture."""
    out = {}
    for entry in json.loads(SHAREGPT.read_text()):
        turns = entry["conversations"]
        for a, b in itertools.pairwise(turns):
            if a["from"] == "human" and b["from"] == "gpt":
                out[entry["id"]] = (a["value"], b["value"])
                break
    return out


def test_sharegpt_first_human_turn_gpt_length_as_budget_vllm_filter() -> None:
    conv = _conversations()
    kept = ["keep-a", "keep-gpt-first", "keep-system-first", "keep-b", "keep-limit"]
    # auto-detected (a JSON list of conversations), 5 requests: each kept conversation once
    res, bodies = _run(Plan(ttft_s=0.001, itl_s=0.0), dataset=SHAREGPT, requests=5, max_tokens=None)
    sent = {b["prompt"]: b["max_tokens"] for b in bodies}
    want = {conv[k][0]: len(_words(conv[k][1])) for k in kept}
    assert sent == want  # prompt = first human turn, budget = its gpt answer's tokens
    assert res.completed == 5 and res.input_len_source == "tokenize"
    assert res.total_input_tokens == sum(len(_words(p)) for p in want)
    assert res.config["dataset_format"] == "auto"
    assert not any("prompt length" in w for w in res.warnings)


def test_sharegpt_max_tokens_replaces_the_answer_length_and_its_filter() -> None:
    conv = _conversations()
    # with --max-tokens, vLLM skips the answer's minimum and checks prompt + max_tokens
    kept = ["keep-a", "drop-short-answer", "keep-gpt-first", "drop-long-total",
            "keep-system-first", "keep-b", "keep-limit"]  # fmt: skip
    _, bodies = _run(dataset=SHAREGPT, dataset_format="sharegpt", requests=7, max_tokens=3)
    assert sorted(b["prompt"] for b in bodies) == sorted(conv[k][0] for k in kept)
    assert {b["max_tokens"] for b in bodies} == {3}


def test_sharegpt_order_is_the_seeds() -> None:
    def order(seed: int) -> list[str]:
        _, bodies = _run(dataset=SHAREGPT, requests=7, seed=seed, max_tokens=2)
        return [b["prompt"] for b in bodies]

    assert order(1) == order(1)
    assert order(1) != order(2)
    assert sorted(order(1)) == sorted(order(2))  # the same 7 kept, in the seed's order


def test_sharegpt_reused_cyclically_beyond_its_conversations() -> None:
    res, bodies = _run(Plan(ttft_s=0.001, itl_s=0.0), dataset=SHAREGPT, requests=7, max_tokens=None)
    prompts = [b["prompt"] for b in bodies]
    assert len(set(prompts)) == 5 and prompts[5:] == prompts[:2]
    assert not any("reused" in w for w in res.warnings)  # a dataset is expected to repeat


def test_dataset_format_errors_name_the_format(tmp_path: Path) -> None:
    jsonl = tmp_path / "p.jsonl"
    jsonl.write_text('{"prompt": "one two three four"}\n')
    with SSEServer(Plan()) as srv:
        with pytest.raises(CeilingError, match="JSON list") as err:
            run_bench(_cfg(srv.url, dataset=jsonl, dataset_format="sharegpt"), progress=False)
        assert "conversations" in err.value.fix
        with pytest.raises(CeilingError, match=r"small\.json:1"):
            run_bench(_cfg(srv.url, dataset=SHAREGPT, dataset_format="jsonl"), progress=False)
    nothing = tmp_path / "empty.json"
    nothing.write_text('[{"conversations": [{"from": "human", "value": "hi"}]}]')
    with SSEServer(Plan()) as srv, pytest.raises(CeilingError, match="human turn answered"):
        run_bench(_cfg(srv.url, dataset=nothing), progress=False)
    short = tmp_path / "short.json"
    short.write_text(
        '[{"conversations": [{"from": "human", "value": "hi"}, {"from": "gpt", "value": "yo"}]}]'
    )
    with SSEServer(Plan()) as srv, pytest.raises(CeilingError, match="length filter"):
        run_bench(_cfg(srv.url, dataset=short, max_tokens=None), progress=False)


# -- lengths within a range ----------------------------------------------------------------------


def test_input_and_output_lengths_drawn_within_the_range() -> None:
    res, bodies = _run(
        input_len=20,
        input_range=0.5,
        max_tokens=10,
        output_range=0.3,
        requests=40,
        save_detailed=True,
    )
    ins = [len(_words(b["prompt"])) for b in bodies]
    outs = [b["max_tokens"] for b in bodies]
    assert (
        all(10 <= n <= 30 for n in ins) and len(set(ins)) > 5
    )  # [floor(20 x 0.5), ceil(20 x 1.5)]
    assert (
        all(7 <= n <= 13 for n in outs) and len(set(outs)) > 3
    )  # [floor(10 x 0.7), ceil(10 x 1.3)]
    recs = res.requests
    assert recs is not None and [r.prompt_tokens for r in recs] == ins  # the server's usage
    assert [r.prompt_tokens_expected for r in recs] == ins  # hit exactly by /tokenize
    assert [r.output_tokens for r in recs] == outs and res.completed == 40
    assert res.total_input_tokens == sum(ins)


def test_lengths_are_the_seeds() -> None:
    def lengths(seed: int) -> list[tuple[str, int]]:
        _, bodies = _run(input_len=20, input_range=0.5, output_range=0.5, requests=8, seed=seed)
        return [(b["prompt"], b["max_tokens"]) for b in bodies]

    assert lengths(3) == lengths(3)
    assert lengths(3) != lengths(4)


def test_default_workload_unchanged_by_the_new_options() -> None:
    # range 0, no prefix, one turn: the same prompts for a seed as before they existed
    _, plain = _run(input_len=9, requests=3, seed=5)
    _, zero = _run(input_len=9, requests=3, seed=5, input_range=0.0, prefix_len=0, turns=1)
    assert [b["prompt"] for b in plain] == [b["prompt"] for b in zero]
    assert all("max_tokens" in b and b["max_tokens"] == 4 for b in plain)


# -- shared prefix -------------------------------------------------------------------------------


def test_prefix_shared_by_every_request_rest_unique() -> None:
    res, bodies = _run(input_len=30, prefix_len=12, input_range=0.3, requests=10)
    words = [_words(b["prompt"]) for b in bodies]
    assert len({tuple(w[:12]) for w in words}) == 1  # identical first 12 tokens
    assert len({tuple(w[12:]) for w in words}) == 10  # the rest unique per request
    assert all(21 <= len(w) <= 39 for w in words)  # the prefix counts in --input-len
    assert res.completed == 10 and not any("reused" in w for w in res.warnings)
    _, again = _run(input_len=30, prefix_len=12, input_range=0.3, requests=10)
    assert [b["prompt"] for b in again] == [b["prompt"] for b in bodies]


# -- multi-turn sessions -------------------------------------------------------------------------


def test_turns_resend_the_growing_history_completions() -> None:
    res, bodies = _run(input_len=8, max_tokens=5, turns=3, requests=2, save_detailed=True)
    assert len(bodies) == 6 and res.completed == 6  # 2 sessions x 3 turns
    answer = " tok" * 5  # what the synthetic server generates
    for s in range(2):
        first, second, third = bodies[3 * s : 3 * s + 3]
        # each turn: the previous prompt, the answer to it, a new user turn of 8 tokens
        assert second["prompt"].startswith(first["prompt"] + answer + "\n")
        assert third["prompt"].startswith(second["prompt"] + answer + "\n")
        assert [len(_words(b["prompt"])) for b in (first, second, third)] == [8, 21, 34]
    recs = res.requests
    assert recs is not None
    assert [r.turn for r in recs] == [1, 2, 3, 1, 2, 3]
    assert [r.prompt_tokens for r in recs] == [8, 21, 34, 8, 21, 34]  # the server's usage
    assert [r.prompt_tokens_expected for r in recs] == [8, 21, 34, 8, 21, 34]
    assert len({r.index for r in recs}) == 6
    assert not any("prompt length" in w for w in res.warnings)


def test_turns_in_chat_append_assistant_and_user_messages() -> None:
    res, bodies = _run(
        input_len=6, max_tokens=3, turns=3, requests=3, chat=True, mode="concurrency",
        concurrency=[3], prefix_len=2,
    )  # fmt: skip
    sessions: dict[str, list[list[dict[str, str]]]] = defaultdict(list)
    for b in bodies:
        sessions[b["messages"][0]["content"]].append(b["messages"])
    assert len(sessions) == 3 and res.completed == 9
    for turns in sessions.values():
        assert [len(m) for m in turns] == [1, 3, 5]
        assert turns[2][:3] == turns[1]  # the history, resent as it was
        assert [m["role"] for m in turns[2]] == ["user", "assistant", "user", "assistant", "user"]
        assert turns[2][1]["content"] == turns[2][3]["content"] == " tok" * 3
        assert all(len(_words(m["content"])) == 6 for m in turns[2][::2])
    firsts = [_words(k) for k in sessions]
    assert len({tuple(w[:2]) for w in firsts}) == 1  # the prefix opens each session only


def test_a_failed_turn_ends_its_session() -> None:
    def plan(i: int, _body: dict[str, Any]) -> Plan:
        return Plan(ttft_s=0.001, itl_s=0.0005, status=500 if i == 1 else 200)

    res, bodies = _run(plan, input_len=5, turns=3, requests=2, max_failed_pct=100)  # type: ignore[arg-type]
    # session 1: turn 1 ok, turn 2 fails, turn 3 never sent; session 2: all three
    assert len(bodies) == 5 and res.completed == 4 and res.failed == 1


def test_turns_are_the_seeds() -> None:
    _, a = _run(input_len=5, turns=2, requests=2, seed=7)
    _, b = _run(input_len=5, turns=2, requests=2, seed=7)
    _, c = _run(input_len=5, turns=2, requests=2, seed=8)
    assert [x["prompt"] for x in a] == [x["prompt"] for x in b] != [x["prompt"] for x in c]


# -- the server's counts -------------------------------------------------------------------------


def _prompt_len_warnings(res: Any) -> list[str]:
    return [w for w in res.warnings if "another prompt length than intended" in w]


def test_prompt_tokens_come_from_usage_and_a_constant_offset_is_a_note() -> None:
    res, _ = _run(
        Plan(ttft_s=0.001, itl_s=0.0005, prompt_tokens_offset=2), input_len=10, requests=3
    )
    assert res.total_input_tokens == 3 * 12  # the server's count, not the intended 10
    assert _prompt_len_warnings(res) == []  # the server's framing (a BOS token, a template)
    assert res.prompt_tokens_offset == 2
    said = [n for n in res.notes if "+2 tokens" in n]
    assert len(said) == 1 and "every prompt" in said[0]


def test_a_constant_offset_over_several_levels_is_said_once() -> None:
    res, _ = _run(
        Plan(ttft_s=0.001, itl_s=0.0005, prompt_tokens_offset=1),
        input_len=10,
        requests=2,
        mode="concurrency",
        concurrency=[1, 2],
    )
    assert [lv.prompt_tokens_offset for lv in res.levels] == [1, 1]
    assert _prompt_len_warnings(res) == [] and len(res.notes) == 1


def test_a_varying_prompt_length_difference_is_warned() -> None:
    def plan(i: int, _body: dict[str, Any]) -> Plan:
        return Plan(ttft_s=0.001, itl_s=0.0005, prompt_tokens_offset=1 + i % 2)

    res, _ = _run(plan, input_len=10, requests=3)  # type: ignore[arg-type]
    said = _prompt_len_warnings(res)
    assert len(said) == 1 and "3 of 3 requests" in said[0] and "+1 to +2 tokens" in said[0]
    assert res.prompt_tokens_offset is None and res.notes == []


def test_a_bos_like_offset_with_turns_is_no_warning() -> None:
    # A first turn counts the framing once more than intended; a later turn's intended length
    # already holds the server's count of its history (framing included): two constants.
    res, _ = _run(
        Plan(ttft_s=0.001, itl_s=0.0005, prompt_tokens_offset=1), input_len=5, turns=3, requests=2
    )
    assert res.completed == 6
    assert _prompt_len_warnings(res) == []
    assert res.prompt_tokens_offset == 1 and res.later_turn_tokens_offset == 0


# -- conflicts -----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("options", "message", "fix"),
    [
        ({"prefix_len": 12}, "--prefix-len 12 is not shorter than --input-len 12", "below 12"),
        ({"prefix_len": 7, "input_range": 0.5}, r"shortest prompt .* \(6 tokens\)", "below 6"),
        ({"turns": 2, "dataset": SHAREGPT}, "--turns conflicts with --dataset", "drop --turns"),
        ({"prefix_len": 2, "dataset": SHAREGPT}, "--prefix-len conflicts", "drop --prefix-len"),
        ({"input_range": 0.2, "dataset": SHAREGPT}, "--input-range conflicts", "or drop --dataset"),
        ({"output_range": 0.2, "dataset": SHAREGPT}, "--output-range conflicts", "drop"),
        ({"dataset_format": "sharegpt"}, "needs --dataset", "add --dataset"),
        ({"turns": 2, "mode": "capacity", "slo": ["ttft:p99<=1s"]}, "--turns 2 conflicts", "rate"),
    ],
)
def test_conflicting_workload_options_refused(
    options: dict[str, object], message: str, fix: str
) -> None:
    from ceiling.bench.slo import parse_slos

    if "slo" in options:
        options = {**options, "slo": parse_slos(",".join(options["slo"]))}  # type: ignore[arg-type]
    with pytest.raises(CeilingError, match=message) as err:
        _cfg("http://127.0.0.1:9", **options)
    assert fix in err.value.fix


@pytest.mark.parametrize("value", [128, 512])  # 128: the default, typed out
def test_input_len_given_with_a_dataset_refused(value: int) -> None:
    with pytest.raises(CeilingError, match="--input-len conflicts with --dataset") as err:
        BenchConfig(url="http://127.0.0.1:9", dataset=SHAREGPT, input_len=value)
    assert err.value.fix == "drop --input-len, or drop --dataset"
    # not given: the dataset's lengths, no refusal
    assert BenchConfig(url="http://127.0.0.1:9", dataset=SHAREGPT).dataset == SHAREGPT


@pytest.mark.parametrize(
    ("flag", "value"),
    [("--input-len", "128"), ("--input-len", "64"), ("--input-range", "0"), ("--turns", "1")],
)
def test_cli_refuses_a_shaping_option_typed_with_a_dataset(
    flag: str, value: str, capsys: pytest.CaptureFixture[str]
) -> None:
    from ceiling.cli import main

    # typed at its default value too: the CLI passes what was typed, not what differs
    rc = main(["bench", "--url", "http://127.0.0.1:9", "--dataset", str(SHAREGPT), flag, value])
    err = capsys.readouterr().err
    assert rc == 2
    assert f"{flag} conflicts with --dataset" in err and f"drop {flag}, or drop --dataset" in err


def test_cli_dataset_alone_is_not_refused(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from ceiling.cli import main

    args = ["--dataset", str(SHAREGPT), "--requests", "2", "--warmup", "0", "--max-tokens", "2"]
    with SSEServer(Plan(ttft_s=0.001, itl_s=0.0)) as srv:
        out = ["--quiet", "--json", "--out", str(tmp_path / "r.json")]
        rc = main(["bench", "--url", srv.url, *args, *out])
    assert rc == 0 and json.loads(capsys.readouterr().out)["completed"] == 2


def test_a_sharegpt_file_is_decoded_once_per_run(monkeypatch: pytest.MonkeyPatch) -> None:
    text = SHAREGPT.read_text().strip()
    decoded: list[int] = []
    real = json.loads

    def counting(s: Any, *a: Any, **kw: Any) -> Any:
        if isinstance(s, str) and s.strip() == text:
            decoded.append(1)
        return real(s, *a, **kw)

    monkeypatch.setattr(json, "loads", counting)
    res, _ = _run(Plan(ttft_s=0.001, itl_s=0.0), dataset=SHAREGPT, requests=5, max_tokens=None)
    assert res.completed == 5
    assert len(decoded) == 1  # auto-detection and reading share one decode


@pytest.mark.parametrize("ratio", [1.0, -0.1])
def test_range_outside_zero_to_one_refused(ratio: float) -> None:
    from ceiling.bench.config import make_config

    with pytest.raises(CeilingError, match="--input-range"):
        make_config(url="http://127.0.0.1:9", input_range=ratio)


def test_sessions_travel_to_worker_processes() -> None:
    # a session's later turns ride in its Prompt to the worker that sends it
    res, bodies = _run(
        input_len=4, max_tokens=2, turns=2, requests=4, mode="concurrency", concurrency=[2],
        workers=2,
    )  # fmt: skip
    assert res.completed == 8 and len(bodies) == 8
    firsts = {b["prompt"] for b in bodies if "\n" not in b["prompt"]}
    seconds = [b["prompt"] for b in bodies if "\n" in b["prompt"]]
    assert len(firsts) == 4 and sorted(s.split(" tok")[0] for s in seconds) == sorted(firsts)
