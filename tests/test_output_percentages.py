"""Percentages read the same everywhere (``ceiling.fmt.pct``): about two significant digits, no
``98.2345 %``, no ``0 %`` for a small non-zero share, no ``100 %`` for a share under 100."""

from __future__ import annotations

import re

import pytest

from ceiling.fmt import pct, share


@pytest.mark.parametrize(
    ("value", "text"),
    [
        (0.0, "0 %"),
        (0.4, "0.4 %"),
        (0.04, "0.04 %"),
        (0.0004, "0.0004 %"),
        (1e-9, "<0.000001 %"),
        (4.24, "4.2 %"),
        (9.96, "10 %"),
        (37.4, "37 %"),
        (98.2345, "98 %"),
        (99.7, "99.7 %"),
        (99.96, ">99.9 %"),
        (100.0, "100 %"),
        (26593.2, "26,593 %"),
        (-29.8, "-30 %"),
        (-0.0963, "-0.1 %"),
    ],
)
def test_pct_keeps_two_significant_digits_and_never_a_false_zero(value, text):
    assert pct(value) == text


def test_signed_pct_marks_gains_and_share_takes_a_fraction():
    assert pct(17.6, signed=True) == "+18 %"
    assert pct(-0.04, signed=True) == "-0.04 %"
    assert pct(0.0, signed=True) == "0 %"
    assert pct(99.96, signed=True) == "+100 %"  # a delta, not a share: no ">99.9"
    assert share(0.004) == "0.4 %"
    assert pct(12.34, unit="") == "12"


def test_predict_shows_a_small_component_share_as_non_zero(capsys):
    from ceiling.predict.api import predict
    from ceiling.predict.schema import PredictRequest
    from ceiling.render.predict import print_prediction

    p = predict(PredictRequest(model="kimi-k2.5", gpu="rtx-pro-6000", gpus=8,
                               link="pcie5-switch", tp=8))  # fmt: skip
    assert 0 < p.component_share["kv"] < 0.005
    print_prediction(p)
    text = capsys.readouterr().out
    kv = next(line for line in text.splitlines() if re.match(r"│ kv\b", line))
    assert share(p.component_share["kv"]) in kv and " 0 % " not in kv
    assert not re.search(r"\d\.\d{3,} %", text)  # no over-precise percentage anywhere
