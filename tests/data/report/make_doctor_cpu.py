"""Regenerate ``doctor-cpu.json``: a real doctor run, written by ``DoctorResult`` itself.

The fixture is what ``ceiling doctor`` writes for a CPU-served model (the tiny Llama's shape)
behind the synthetic SSE server (4 ms per token), with the concurrency sweep and telemetry
(no NVIDIA GPU here: telemetry says why it is unavailable). Run it when ``DoctorResult`` gains
or changes a field (tests/test_report.py fails until then):

    .venv/bin/python tests/data/report/make_doctor_cpu.py
"""

from __future__ import annotations

import json
import os
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parents[1]))  # tests/: the synthetic server

from ceiling.console import dumps  # noqa: E402
from ceiling.flows.doctor import DoctorConfig  # noqa: E402
from ceiling.flows.doctor import run as run_doctor  # noqa: E402
from sse_server import Plan, SSEServer  # noqa: E402

TINY_LLAMA = {
    "architectures": ["LlamaForCausalLM"],
    "num_hidden_layers": 2,
    "hidden_size": 128,
    "intermediate_size": 256,
    "num_attention_heads": 2,
    "num_key_value_heads": 2,
    "vocab_size": 512,
    "torch_dtype": "float32",
}


def main() -> None:
    with tempfile.TemporaryDirectory() as tmp:
        model = Path(tmp) / "fm"
        model.mkdir()
        (model / "config.json").write_text(json.dumps(TINY_LLAMA))
        (model / "model.safetensors").write_bytes(os.urandom(1_700_000))
        with SSEServer(Plan(itl_s=0.004, ttft_s=0.01)) as srv:
            res = run_doctor(
                DoctorConfig(
                    url=srv.url,
                    model_path=str(model),
                    max_tokens=32,
                    repeat=2,
                    concurrency=[1, 2],
                    concurrency_max_tokens=16,
                    out_dir=str(Path(tmp) / "out"),
                    progress=False,
                    sanity=False,
                )
            )
    res.files = {}  # temporary paths: nothing a report links to
    (HERE / "doctor-cpu.json").write_text(dumps(res) + "\n", encoding="utf-8")
    print(f"wrote {HERE / 'doctor-cpu.json'}: {res.verdict.headline if res.verdict else '-'}")


if __name__ == "__main__":
    main()
