"""--help is a manual: one example per command, every option described, no Python types."""

from __future__ import annotations

import re

import pytest
import typer

from ceiling.cli import _plain_metavars, _register_all, app, main


def _commands() -> dict[str, object]:
    _register_all()
    group = typer.main.get_command(app)
    _plain_metavars(group)
    return dict(group.commands)  # type: ignore[attr-defined]


COMMANDS = sorted(_commands())


def test_every_command_is_listed():
    assert {"predict", "bench", "doctor", "shm", "stop", "launch", "sweep"} <= set(COMMANDS)


@pytest.mark.parametrize("name", COMMANDS)
def test_help_has_an_example_and_plain_metavars(name, capsys):
    assert main([name, "--help"]) == 0
    text = capsys.readouterr().out
    assert re.search(r"Examples?:\n\s+ceiling " + name + r"\b", text), text
    # no Python type in a metavar: <str>, <int range>, <list[Path]>, <float>, <path>
    assert not re.search(r"<(str|int|float|path|bool|list)[^>]*>", text), text


@pytest.mark.parametrize("name", COMMANDS)
def test_every_option_is_described(name):
    cmd = _commands()[name]
    for param in cmd.params:  # type: ignore[attr-defined]
        assert (param.help or "").strip(), f"{name} {param.name}: no help text"


@pytest.mark.parametrize("name", ["bench", "doctor"])
def test_api_key_variable_is_documented(name, capsys):
    main([name, "--help"])
    assert "CEILING_API_KEY" in capsys.readouterr().out


def test_option_kind_is_read_from_either_typer_generation():
    """Typer < 0.29 gives Click a ParamType (``param.type.name``); Typer >= 0.29 describes its
    own parameters (``display_type``). The GPU image ships typer 0.27: the CLI must start there."""
    from types import SimpleNamespace

    from ceiling.cli import _type_label

    old = SimpleNamespace(type=SimpleNamespace(name="integer range"))
    new = SimpleNamespace(display_type=lambda ctx: "<FLOAT>")
    broken = SimpleNamespace(display_type=lambda ctx: 1 / 0)
    assert _type_label(old) == "integer range"
    assert _type_label(new) == "<float>"
    assert _type_label(broken) == "" and _type_label(SimpleNamespace()) == ""
