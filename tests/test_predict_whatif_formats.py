"""What-if rows name the exact weight format (issue 39): FP8 block-128, per-tensor, per-channel
are different scale layouts with different kernels, and every format a catalog checkpoint ships
has its row."""

from __future__ import annotations

import pytest

from ceiling.predict.api import PredictRequest, predict
from ceiling.predict.whatif import FORMAT_WORDS, shipped_formats
from ceiling.spec.model import catalog, load_model
from ceiling.spec.quant import NAMED_FORMATS


def _catalog_formats() -> set[str]:
    """Every quantized format of the catalog, through the full model builder (not the
    quantization configs alone, as shipped_formats reads them): the two readings agree."""
    return {f for name in catalog() for f in load_model(name).formats()} - {"bf16", "fp16"}


def test_shipped_formats_are_every_catalog_format_and_each_has_words() -> None:
    names = {NAMED_FORMATS[k]().name for k in shipped_formats()}
    assert names == _catalog_formats()
    assert {"fp8-block128x128", "fp8-tensor", "nvfp4", "mxfp4", "int4-g32"} <= names
    assert all(n in FORMAT_WORDS for n in names)


def test_the_fp8_words_say_which_fp8() -> None:
    assert "block-128" in FORMAT_WORDS["fp8-block128x128"]
    assert "per-tensor" in FORMAT_WORDS["fp8-tensor"] and "on the fly" in FORMAT_WORDS["fp8-tensor"]
    assert "per-channel" in FORMAT_WORDS["fp8-channel"]
    assert len(set(FORMAT_WORDS.values())) == len(FORMAT_WORDS)


@pytest.fixture(scope="module")
def bf16_rows() -> list[str]:
    pred = predict(PredictRequest(model="llama-3.1-8b", gpu="h100-sxm", what_if=True))
    return [w.change for w in pred.what_if]


def test_a_16_bit_model_gets_a_row_for_every_shipped_format(bf16_rows: list[str]) -> None:
    for key in shipped_formats():
        words = FORMAT_WORDS[NAMED_FORMATS[key]().name]
        assert sum(words in c for c in bf16_rows) == 1, key
    assert not any(c.endswith("weights fp8") for c in bf16_rows)  # never the bare name


def test_a_checkpoint_gets_no_row_for_its_own_format_but_its_same_width_twins() -> None:
    pred = predict(PredictRequest(model="qwen3-32b-fp8", gpu="h100-sxm", what_if=True))
    rows = [w.change for w in pred.what_if]
    assert not any(FORMAT_WORDS["fp8-block128x128"] in c for c in rows)
    assert any(FORMAT_WORDS["fp8-tensor"] in c for c in rows)  # same width, another kernel
