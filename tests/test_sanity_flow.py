"""``ceiling sanity --variant`` (ceiling.flows.sanity): the flow launches the variant, asks it
with the key it wants, fills in what the user left out from the variant and ``/v1/models``, and
stops the server afterwards; bad inputs fail before any launch."""

from __future__ import annotations

from typing import Any

import pytest

import ceiling.flows.sanity as flow
from ceiling.errors import CeilingError
from ceiling.flows.target import server_alive
from fake_engine import write_variant


@pytest.fixture(autouse=True)
def _no_api_key(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("CEILING_API_KEY", raising=False)
    monkeypatch.delenv("OPENAI_API_KEY", raising=False)


def test_a_variant_is_launched_asked_with_its_key_and_stopped(tmp_path, monkeypatch):
    seen: dict[str, Any] = {}

    def asked(url, model, engine, model_dir, dtype, reference, timeout_s):
        seen.update(url=url, model=model, engine=engine, model_dir=model_dir, dtype=dtype)
        seen["alive"] = server_alive(url)
        return "the report"

    monkeypatch.setattr(flow, "check_server", asked)
    # the fake wants the key on /v1/models: the flow's own request must carry it
    v = write_variant(tmp_path, "--api-key", "sk-fake-123456", "--dtype", "bfloat16")
    cfg = flow.SanityConfig(variant=str(v), progress=False, launch_timeout_s=60)
    assert flow.run(cfg) == "the report"
    assert seen["alive"] and seen["url"].startswith("http://127.0.0.1:")
    assert seen["model"] == "fake" and seen["engine"] == "vllm"
    assert seen["model_dir"] == str(tmp_path / "model") and seen["dtype"] == "bfloat16"
    assert not server_alive(seen["url"])  # stopped on the way out


@pytest.mark.parametrize(
    ("cfg", "says"),
    [
        (flow.SanityConfig(), "sanity needs a server to ask"),
        (
            flow.SanityConfig(variant="v.yaml", timeout_s=0),
            "--request-timeout 0 is not a positive time",
        ),
        (flow.SanityConfig(variant="v.yaml", model_path="/nope/here"), "--model /nope"),
    ],
)
def test_bad_inputs_fail_before_any_launch(cfg, says, monkeypatch):
    def no_launch(*a: object, **k: object) -> None:
        raise AssertionError("launched")

    monkeypatch.setattr(flow, "load_variant", no_launch)
    with pytest.raises(CeilingError) as err:
        flow.run(cfg)
    assert err.value.message.startswith(says)
