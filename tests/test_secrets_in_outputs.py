"""A planted API key and token never reach a file that doctor, sweep or deploy write (issue
25): every file under their output folders is read and searched for both values; a copy that
must keep a secret to work (sweep's variant copies, which are launched) is mode 0600."""

from __future__ import annotations

import json
import stat
from pathlib import Path

from ceiling.cli import main
from sse_server import Plan, SSEServer

KEY = "sk-planted/key with spaces-31337"
TOKEN = "hf_plantedTOKEN4242424242"


def _leaks(folder: Path, skip: set[Path] = frozenset()) -> dict[str, list[str]]:
    found: dict[str, list[str]] = {}
    files = [p for p in folder.rglob("*") if p.is_file() and p not in skip]
    assert files, f"nothing was written under {folder}"
    for p in files:
        data = p.read_bytes()
        hits = [name for name, v in (("key", KEY), ("token", TOKEN)) if v.encode() in data]
        if hits:
            found[str(p)] = hits
    return found


def test_doctor_writes_no_secret(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("CEILING_API_KEY", KEY)
    monkeypatch.setenv("HF_TOKEN", TOKEN)
    model = tmp_path / "model"
    model.mkdir()
    (model / "config.json").write_text(json.dumps({"num_hidden_layers": 2, "hidden_size": 64}))
    out = tmp_path / "out"
    with SSEServer(Plan(itl_s=0.001)) as srv:
        argv = ["doctor", "--url", srv.url, "--model", str(model), "--max-tokens", "8",
                "--repeat", "1", "--concurrency", "1", "--no-telemetry", "--no-measure-cpu",
                "--no-sanity", "--out-dir", str(out)]  # fmt: skip
        assert main(argv) == 0, capsys.readouterr().err
        assert srv.headers and srv.headers[-1].get("Authorization") == f"Bearer {KEY}"
    seen = capsys.readouterr()
    assert KEY not in seen.out + seen.err and TOKEN not in seen.out + seen.err
    assert _leaks(out) == {}


def test_sweep_writes_no_secret_outside_its_0600_variant_copies(tmp_path, capsys):
    from ceiling.flows.sweep import run
    from sweep_helpers import synthetic_trial

    (tmp_path / "base.yaml").write_text("engine: vllm\nmodel: /nonexistent/model\n")
    plan = tmp_path / "plan.yaml"
    plan.write_text(
        "name: secrets\nrepeats: 2\nbench: {mode: single, max_tokens: 8}\nvariants:\n"
        "  - name: base\n    extends: base.yaml\n"
        f"    env: {{HF_TOKEN: '{TOKEN}'}}\n    args: ['--api-key', '{KEY}']\n"
        "  - name: fast\n    extends: base.yaml\n"
        f"    env: {{HF_TOKEN: '{TOKEN}', VLLM_API_KEY: '{KEY}'}}\n"
    )
    out = tmp_path / "out"
    run(plan, out, trial_fn=synthetic_trial, preflight_fn=None)
    copies = set((out / "variants").glob("*.yaml"))
    assert copies
    for p in copies:
        assert stat.S_IMODE(p.stat().st_mode) == 0o600, p  # launched from: keeps the values
    assert _leaks(out, skip=copies) == {}
    seen = capsys.readouterr()
    assert KEY not in seen.out + seen.err and TOKEN not in seen.out + seen.err


def test_deploy_writes_no_secret(tmp_path, capsys):
    v = tmp_path / "v.yaml"
    v.write_text(
        f"engine: vllm\nmodel: {tmp_path}\nenv: {{HF_TOKEN: '{TOKEN}', VLLM_API_KEY: '{KEY}'}}\n"
    )
    out = tmp_path / "out"
    rc = main(["deploy", str(v), "--image", "vllm/vllm-openai:v0.11.0", "--no-validate",
               "--out-dir", str(out)])  # fmt: skip
    seen = capsys.readouterr()
    assert rc == 0, seen.err
    assert KEY not in seen.out + seen.err and TOKEN not in seen.out + seen.err
    assert _leaks(out) == {}


URL_PASSWORD = "pl4ntedUrlPassw0rd"


def test_deploy_writes_no_url_credential_whatever_variable_holds_it(tmp_path, capsys):
    """A variable whose name says nothing secret can still hold one (a mirror URL with its
    user:password): it goes to the env file like HF_TOKEN, never into the unit or compose."""
    v = tmp_path / "v.yaml"
    v.write_text(
        f"engine: vllm\nmodel: {tmp_path}\n"
        f"env: {{HF_ENDPOINT: 'https://user:{URL_PASSWORD}@hf-mirror.example', "
        "OMP_NUM_THREADS: '2'}\n"
    )
    out = tmp_path / "out"
    rc = main(["deploy", str(v), "--image", "vllm/vllm-openai:v0.11.0", "--no-validate",
               "--out-dir", str(out), "--json"])  # fmt: skip
    seen = capsys.readouterr()
    assert rc == 0, seen.err
    assert URL_PASSWORD not in seen.out + seen.err
    for p in out.rglob("*"):
        assert URL_PASSWORD.encode() not in p.read_bytes(), p
    plan = json.loads(seen.out)["plan"]
    assert plan["secrets"] == ["HF_ENDPOINT"]
    assert "# HF_ENDPOINT=\n" in (out / "ceiling-v.env").read_text()
    unit = (out / "ceiling-v.service").read_text()
    assert 'Environment="OMP_NUM_THREADS=2"' in unit and "HF_ENDPOINT" not in unit


def test_deploy_refuses_a_url_credential_in_a_flag_value(tmp_path, capsys):
    v = tmp_path / "v.yaml"
    v.write_text(
        f"engine: vllm\nmodel: {tmp_path}\n"
        f"args: ['--tokenizer', 'https://user:{URL_PASSWORD}@hf-mirror.example/tok']\n"
    )
    rc = main(["deploy", str(v), "--image", "vllm/vllm-openai:v0.11.0", "--no-validate",
               "--out-dir", str(tmp_path / "out")])  # fmt: skip
    seen = capsys.readouterr()
    assert rc == 2 and "--tokenizer" in seen.err and "credential" in seen.err
    assert URL_PASSWORD not in seen.out + seen.err
    assert not (tmp_path / "out").exists() or not any((tmp_path / "out").iterdir())
