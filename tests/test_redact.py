"""The one secret redactor: keys, URL credentials, secret names; and nothing else garbled."""

from __future__ import annotations

from ceiling import redact as r
from ceiling.console import dumps


def test_keys_from_the_environment_and_registered_ones(monkeypatch):
    monkeypatch.setenv("CEILING_API_KEY", "sk-env-key-000111")
    r.register(["hf_registered_token_42"])
    text = "Bearer sk-env-key-000111 and hf_registered_token_42"
    assert r.redact(text) == "Bearer *** and ***"
    assert "sk-env-key-000111" not in dumps({"headers": text})  # every JSON ceiling writes


def test_url_credentials_and_query_values():
    assert r.redact("GET http://user:s3cr3t@10.0.0.1:8000/v1") == "GET http://***@10.0.0.1:8000/v1"
    assert r.redact("https://TOKEN123456@gateway/llm") == "https://***@gateway/llm"
    assert r.redact("at user:s3cr3t@127.0.0.1:80") == "at ***@127.0.0.1:80"
    assert r.redact("http://h/v1?api_key=abc&x=1") == "http://h/v1?api_key=***&x=1"
    assert r.redact("mail someone@example.com") == "mail someone@example.com"


def test_short_values_are_masked_by_name_only():
    r.register(["test"])  # too short to mask in every text
    assert r.redact("the latest test") == "the latest test"
    assert r.redact_argv(["--api-key", "test"]) == ["--api-key", "***"]


def test_secret_names_are_whole_words():
    argv = [
        "--max-num-batched-tokens",
        "8192",
        "--tokenizer",
        "/m",
        "--hf-token=hf_x",
        "--api-key",
        "k",
    ]
    assert r.redact_argv(argv) == [
        "--max-num-batched-tokens", "8192", "--tokenizer", "/m", "--hf-token=***", "--api-key", "***",
    ]  # fmt: skip
    env = {"HF_TOKEN": "x", "AWS_SECRET_ACCESS_KEY": "y", "VLLM_CPU_KVCACHE_SPACE": "1"}
    assert r.redact_env(env) == {
        "HF_TOKEN": "***", "AWS_SECRET_ACCESS_KEY": "***", "VLLM_CPU_KVCACHE_SPACE": "1",
    }  # fmt: skip


def test_a_loaded_variant_registers_its_secrets(tmp_path):
    from ceiling.engines.variant import load_variant

    p = tmp_path / "v.yaml"
    p.write_text(
        "engine: vllm\nmodel: org/m\nargs: {api-key: sk-variant-key-777}\n"
        "env: {HF_TOKEN: hf_variant_token_888}\n"
    )
    load_variant(p)
    assert r.redact("sk-variant-key-777 / hf_variant_token_888") == "*** / ***"


def test_the_key_in_use_for_a_launched_server():
    assert r.env_api_key() != "sk-launched-999999"
    with r.use_api_key("sk-launched-999999"):
        assert r.env_api_key() == "sk-launched-999999"
        assert r.redact("x sk-launched-999999") == "x ***"
    assert r.env_api_key() != "sk-launched-999999"
