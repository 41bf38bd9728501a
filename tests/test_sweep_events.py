"""Sweep trial events are a discriminated union on ``type``: each kind is its own class."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from ceiling.sweep.events import Done, Failed, Repeat, StoppedEarly, as_event


def test_a_mapping_becomes_the_class_its_type_names():
    ev = as_event({"type": "repeat", "idx": 2, "tok_s": 41.5, "result": {"ok": True}})
    assert isinstance(ev, Repeat) and ev.idx == 2 and ev.tok_s == 41.5
    assert isinstance(as_event({"type": "stopped_early", "reason": "slower"}), StoppedEarly)
    assert isinstance(as_event({"type": "done"}), Done)
    ev2 = Failed(error="x")
    assert as_event(ev2) is ev2  # an event passes through


def test_json_keeps_the_type_key():
    assert Repeat(idx=0, tok_s=None).model_dump(by_alias=True)["type"] == "repeat"
    assert Failed(error="boom").model_dump(by_alias=True, mode="json") == {
        "type": "failed", "error": "boom", "log_path": None,
    }  # fmt: skip


@pytest.mark.parametrize(
    "bad",
    [
        {"type": "finished"},  # no such event
        {"type": "repeat"},  # a repeat without its index
        {"type": "failed", "error": "x", "eror": "y"},  # a misspelled field
    ],
)
def test_an_unknown_type_or_field_is_refused(bad):
    with pytest.raises(ValidationError):
        as_event(bad)
