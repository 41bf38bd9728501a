"""One CLI vocabulary: docs/cli.md's table made executable. Every option of every command has
exactly one row (one meaning), takes one kind of value wherever it appears, and the table lists
exactly the commands that have it; renamed spellings still work, with a deprecation line."""

from __future__ import annotations

import re
from collections import defaultdict
from pathlib import Path

import pytest

from ceiling.choices import EngineName, KvDtype, SpecMethod, values
from ceiling.cli import _choices, _command, main, option_kind

DOC = Path(__file__).resolve().parents[1] / "docs" / "cli.md"


def _app_options():
    """(option, command, Click parameter) for every visible option of every command."""
    for name, cmd in _command().commands.items():
        subs = (
            [(f"{name} {k}", s) for k, s in cmd.commands.items()]
            if hasattr(cmd, "commands")
            else [(name, cmd)]
        )
        for full, sub in subs:
            for p in sub.params:
                if p.param_type_name != "option" or p.hidden:
                    continue
                for opt in [*p.opts, *(getattr(p, "secondary_opts", None) or [])]:
                    if opt.startswith("--"):
                        yield opt, full, p


def _app_rows() -> dict[str, tuple[set[str], set[str]]]:
    """option -> (kinds it takes, commands that have it), read from the Typer app."""
    rows: dict[str, tuple[set[str], set[str]]] = defaultdict(lambda: (set(), set()))
    for opt, full, p in _app_options():
        rows[opt][0].add(option_kind(p))
        rows[opt][1].add(full)
    return rows


def _app_choices() -> dict[str, dict[str, frozenset[str]]]:
    """choice option -> {command: the values it offers there}."""
    out: dict[str, dict[str, frozenset[str]]] = defaultdict(dict)
    for opt, full, p in _app_options():
        if option_kind(p) == "choice":
            out[opt][full] = frozenset(_choices(p))
    return out


def _doc_rows() -> dict[str, tuple[str, set[str]]]:
    text = DOC.read_text(encoding="utf-8")
    table = text.split("| option | takes | meaning | commands |", 1)[1].split("\n\n", 1)[0]
    out: dict[str, tuple[str, set[str]]] = {}
    for line in table.strip().splitlines()[1:]:
        cells = [c.strip() for c in line.strip("|").split("|")]
        opt = cells[0].strip("`")
        assert opt not in out, f"docs/cli.md: two rows for {opt}"
        out[opt] = (cells[1], {c.strip() for c in cells[-1].split(",")})
    return out


def test_no_option_name_has_two_meanings_and_the_table_is_the_app():
    app, doc = _app_rows(), _doc_rows()
    two = {o: kinds for o, (kinds, _) in app.items() if len(kinds) > 1}
    assert not two, f"one option name, two kinds of value: {two}"
    assert set(app) == set(doc), (
        f"options missing from docs/cli.md: {sorted(set(app) - set(doc))}; "
        f"rows for no option: {sorted(set(doc) - set(app))}"
    )
    for opt, (kinds, commands) in app.items():
        kind, listed = doc[opt]
        assert {kind} == kinds, f"{opt}: the table says {kind}, the app takes {kinds}"
        assert listed == commands, f"{opt}: the table lists {listed}, the app has it in {commands}"


def test_the_rules_hold():
    app = _app_rows()
    for opt in ("--profile", "--profile-out", "--report", "--trtllm-config"):  # files, not text
        assert app[opt][0] == {"file"}, opt
    assert app["--out"][0] == {"file"} and app["--out-dir"][0] == {"dir"}
    # a filesystem option says which it takes: a file or a directory, never "a path"
    paths = {o for o, (kinds, _) in app.items() if "path" in kinds}
    assert not paths, f"options that take 'a path' (say file or dir): {sorted(paths)}"
    for opt in ("--variant", "--log", "--dataset", "--env-file", "--python"):
        assert app[opt][0] == {"file"}, opt
    for opt in ("--root", "--trace-dir", "--shm-root"):
        assert app[opt][0] == {"dir"}, opt
    assert app["--model"][0] == {"text"} and "bench" not in app["--model"][1]  # served: not --model
    assert {"bench", "sanity", "trace capture"} <= app["--served-model"][1]
    assert not any(o == "--timeout" for o in app), "a timeout is named by what it bounds"
    for opt in ("--engine", "--allreduce", "--kv-dtype", "--mode", "--backend", "--spec"):
        assert app[opt][0] == {"choice"}, opt
    # one meaning each: levels to measure vs streams served; compute dtype vs buffer dtype
    assert app["--concurrency"][1] == {"bench", "doctor"}
    assert {"inspect", "trace capture"} <= app["--streams"][1]
    assert app["--dtype"][1] == {"calibrate", "sanity"}
    for opt in ("--buffer-dtype", "--weight-format"):
        assert app[opt][0] == {"choice"}, opt
    progress = {"bench", "doctor", "sweep", "sanity", "launch", "preflight", "env", "commbench"}
    progress |= {"calibrate"}
    assert progress <= app["--quiet"][1]


def test_a_choice_value_means_one_thing_in_every_command():
    """An option offers the same values wherever it appears, or its row names every value (one
    namespace: each command offers the part it supports, a value never means two things)."""
    doc = _doc_rows()
    text = DOC.read_text(encoding="utf-8")
    for opt, per_command in _app_choices().items():
        if len(set(per_command.values())) == 1:
            continue
        row = next(line for line in text.splitlines() if line.startswith(f"| `{opt}` |"))
        named = set(re.findall(r"`([^`]+)`", row.split("|")[3]))
        every = set().union(*per_command.values())
        assert every <= named, f"{opt}: values {sorted(every - named)} not named in its row"
        assert doc[opt][0] == "choice"


def test_every_engine_option_speaks_one_set_of_engine_names():
    """--engine is the inference engine in every command: predict's engines, the adapters'
    and calibrate's are parts of one set of names (choices.EngineName), not three."""
    from ceiling.engines import engine_names

    per_command = _app_choices()["--engine"]
    assert set(per_command) == _app_rows()["--engine"][1]  # a choice wherever it appears
    assert set().union(*per_command.values()) == set(values(EngineName))
    assert set(engine_names()) <= set(values(EngineName))


def test_help_lists_the_choices(capsys):
    assert main(["predict", "--help"]) == 0
    out = capsys.readouterr().out
    assert "[vllm|sglang|trtllm|generic|llamacpp]" in out and "[auto|nccl|oneshot]" in out
    assert main(["doctor", "--help"]) == 0
    assert re.search(r"--engine \[[a-z|-]*llamacpp[a-z|-]*vllm\]", capsys.readouterr().out)


def test_predict_help_lists_the_spec_methods_and_weight_formats(capsys):
    """Read from the one place each is defined: ``choices.SpecMethod`` (which PredictRequest
    validates against) and spec.quant's table of named formats (which predict resolves)."""
    from ceiling.predict.schema import PredictRequest
    from ceiling.spec.quant import GGUF_MIXES, NAMED_FORMATS

    assert PredictRequest.model_fields["spec"].annotation is SpecMethod
    assert main(["predict", "--help"]) == 0
    out = capsys.readouterr().out
    assert "[" + "|".join(values(SpecMethod)) + "]" in out
    # then llama.cpp's file types (--engine llamacpp): one option, one list
    assert "[" + "|".join((*NAMED_FORMATS, *GGUF_MIXES)) + "]" in out


def test_an_unknown_weight_format_is_refused_while_parsing(capsys):
    args = ["predict", "--model", "llama-3.1-8b", "--gpu", "h100-sxm", "--weight-format", "int3"]
    assert main(args) == 2
    assert "int3" in capsys.readouterr().err


@pytest.mark.parametrize("value", ["", "{tmp}"])
def test_a_file_option_refuses_a_directory_while_parsing(value, tmp_path, capsys):
    """--profile was text: "" was read as no profile (silently) and a directory failed late."""
    args = ["predict", "--model", "llama-3.1-8b", "--gpu", "h100-sxm"]
    assert main([*args, "--profile", value.format(tmp=tmp_path)]) == 2
    assert "is a directory" in capsys.readouterr().err


def test_the_kv_dtype_choices_are_what_the_deployment_sizes():
    from ceiling.spec.deployment import KV_DTYPE_BYTES

    assert set(values(KvDtype)) == set(KV_DTYPE_BYTES)


@pytest.mark.parametrize(
    ("argv", "old", "new"),
    [
        (["report", "{missing}", "--out", "{tmp}"], "report --out", "--out-dir"),
        (["sweep", "{missing}", "--out", "{tmp}"], "sweep --out", "--out-dir"),
        (
            ["doctor", "--url", "http://127.0.0.1:9", "--model-path", "x"],
            "doctor --model-path",
            "--model",
        ),
        (["inspect", "{missing}", "--concurrency", "4"], "inspect --concurrency", "--streams"),
        (["commbench", "--dtype", "float99"], "commbench --dtype", "--buffer-dtype"),
    ],
)
def test_old_spellings_work_one_release_with_a_deprecation_line(capsys, tmp_path, argv, old, new):
    argv = [a.format(missing=tmp_path / "missing.json", tmp=tmp_path / "o") for a in argv]
    assert main(argv) == 2  # the command ran with the old spelling (and refused its input)
    err = capsys.readouterr().err
    assert f"warning: {old}" in err and f"use {new}" in err
    assert "No such option" not in err


def test_sanity_model_is_the_input_and_a_served_name_there_is_read_the_old_way(capsys, tmp_path):
    from ceiling.spec.model import is_model_input

    assert is_model_input("llama-3.1-8b") and is_model_input(str(tmp_path))
    assert not is_model_input("tiny")  # a served name
    assert main(["sanity", "--url", "http://127.0.0.1:9", "--model", "tiny", "--quiet"]) == 4
    assert "use --served-model" in capsys.readouterr().err


def _complete(words: str) -> list[str]:
    """What bash's completion asks the app (completion on: `ceiling --install-completion`)."""
    import os
    import subprocess
    import sys

    env = {
        **os.environ,
        "COMP_WORDS": words,
        "COMP_CWORD": str(len(words.split()) - (not words.endswith(" "))),
        "_CEILING_COMPLETE": "complete_bash",
    }
    script = "import sys; from ceiling.cli import main; sys.exit(main())"
    proc = subprocess.run(
        [sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=60
    )
    return proc.stdout.split()


def test_shells_complete_the_choices():
    from ceiling.spec.quant import GGUF_MIXES, NAMED_FORMATS

    assert _complete("ceiling predict --kv-dtype ") == list(values(KvDtype))
    assert _complete("ceiling predict --spec ") == list(values(SpecMethod))
    assert _complete("ceiling predict --weight-format int4") == ["int4-g32", "int4-g128"]
    assert set(_complete("ceiling predict --weight-format ")) == {*NAMED_FORMATS, *GGUF_MIXES}
