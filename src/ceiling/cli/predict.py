"""CLI commands of the predict group (thin: parse options, call the library, print)."""

from __future__ import annotations

from pathlib import Path

import typer

from ceiling.choices import Allreduce, KvDtype, PredictEngine, SpecMethod
from ceiling.cli._vocab import WeightFormatName
from ceiling.errors import CeilingError


def register(app: typer.Typer) -> None:
    """Add this group's commands to the app."""

    @app.command("predict")
    def predict_cmd(
        model: str | None = typer.Option(
            None,
            "--model",
            help="catalog name (see --list-models), config.json, or model directory",
        ),
        gpu: str | None = typer.Option(
            None, "--gpu", help="GPU catalog name (see --list-gpus) or a GPU.yaml file"
        ),
        gpus: int | None = typer.Option(
            None,
            "--gpus",
            min=1,
            help="GPUs in total (default tp x pp); extra GPUs become DP replicas",
        ),
        link: str | None = typer.Option(
            None, "--link", help="link kind between GPUs (see --list-links)"
        ),
        tp: int = typer.Option(1, "--tp", min=1, help="tensor parallel size"),
        ep: int = typer.Option(
            1, "--ep", min=1, help="expert parallel size (MoE; reuses the TP/DP ranks)"
        ),
        pp: int = typer.Option(1, "--pp", min=1, help="pipeline parallel size"),
        dp: int | None = typer.Option(
            None, "--dp", min=1, help="data parallel replicas (default gpus / (tp x pp))"
        ),
        dcp: int = typer.Option(
            1,
            "--dcp",
            min=1,
            help="decode context parallel size (vLLM --decode-context-parallel-size; divides "
            "--tp; shards the KV cache the TP ranks replicate: MLA's latent, GQA's KV heads)",
        ),
        engine: PredictEngine = typer.Option("vllm", "--engine", help="the engine to predict"),
        trtllm_option: list[str] = typer.Option(
            [],
            "--trtllm-option",
            help="a TensorRT-LLM LLM-API option KEY=VALUE (--engine trtllm; repeatable): "
            "cuda_graph_config, disable_overlap_scheduler, allreduce_strategy, "
            "enable_attention_dp, kv_cache_config.dtype",
        ),
        trtllm_config: Path | None = typer.Option(
            None,
            "--trtllm-config",
            dir_okay=False,
            help="the YAML file given to trtllm-serve --extra_llm_api_options (--engine trtllm)",
        ),
        allreduce: Allreduce = typer.Option(
            "auto", "--allreduce", help="allreduce implementation (auto: the engine's rule)"
        ),
        no_cuda_graphs: bool = typer.Option(
            False, "--no-cuda-graphs", help="eager decode (no CUDA graphs)"
        ),
        batch: int = typer.Option(1, "--batch", min=1, help="concurrent sequences per replica"),
        context: int = typer.Option(
            1024, "--context", min=1, help="KV length per sequence during decode"
        ),
        prompt_len: int = typer.Option(
            1024, "--prompt-len", min=1, help="prompt length for the prefill/TTFT estimate"
        ),
        kv_dtype: KvDtype = typer.Option(
            "auto", "--kv-dtype", help="KV-cache dtype (auto: the model's)"
        ),
        weight_format: WeightFormatName | None = typer.Option(
            None, "--weight-format", help="override the checkpoint's weight format (all linears)"
        ),
        profile: Path | None = typer.Option(
            None,
            "--profile",
            dir_okay=False,
            help="measured hardware profile JSON (calibrate/commbench)",
        ),
        power_limit: float | None = typer.Option(
            None, "--power-limit", min=1, help="board power cap in W (published boxes run them)"
        ),
        mem_clock: float | None = typer.Option(
            None, "--mem-clock", min=1, help="memory clock in MHz as nvidia-smi reports it"
        ),
        attention_backend: str | None = typer.Option(
            None,
            "--attention-backend",
            help="the engine's attention backend (e.g. sglang triton|flashinfer|fa3; default: "
            "the engine's choice for the GPU)",
        ),
        moe_backend: str | None = typer.Option(
            None,
            "--moe-backend",
            help="the engine's MoE runner (e.g. triton|flashinfer_cutlass|marlin)",
        ),
        async_scheduling: bool | None = typer.Option(
            None,
            "--async-scheduling/--no-async-scheduling",
            help="the engine's async/overlap scheduler (default: the engine's rule)",
        ),
        spec: SpecMethod = typer.Option(
            "none",
            "--spec",
            help="speculative decoding: mtp (the checkpoint's MTP layers), eagle/eagle3 (a draft "
            "model), ngram (prompt lookup)",
        ),
        spec_tokens: int | None = typer.Option(
            None, "--spec-tokens", help="drafted tokens per step (default 3)"
        ),
        spec_draft_layers: int | None = typer.Option(
            None, "--spec-draft-layers", help="EAGLE draft decoder layers (default 1)"
        ),
        spec_acceptance_rate: float | None = typer.Option(
            None,
            "--spec-acceptance-rate",
            help="accepted / drafted tokens, 0-1 (vLLM's draft acceptance rate)",
        ),
        spec_acceptance_length: float | None = typer.Option(
            None,
            "--spec-acceptance-length",
            help="mean tokens per step, bonus token included (1 to tokens + 1)",
        ),
        what_if: bool = typer.Option(
            False, "--what-if", help="also rank one-knob changes by expected tok/s"
        ),
        gguf: Path | None = typer.Option(
            None,
            "--gguf",
            dir_okay=False,
            help="--engine llamacpp: the GGUF file whose weight types are read (header only)",
        ),
        json_out: bool = typer.Option(False, "--json", help="print one JSON object on stdout"),
        list_gpus: bool = typer.Option(False, "--list-gpus", help="list the GPU catalog and exit"),
        list_links: bool = typer.Option(False, "--list-links", help="list the link kinds and exit"),
        list_models: bool = typer.Option(
            False, "--list-models", help="list the shipped model configs and exit"
        ),
    ) -> None:
        """Predict decode: expected (this engine's kernels) and bound (physics), per operation.

        
        Example:
          ceiling predict --model llama-3.1-70b --gpu h100-sxm --tp 4 --what-if
        """
        from ceiling.render import predict as render

        if list_gpus or list_links or list_models:
            render.print_catalog(
                gpus=list_gpus, links=list_links, models=list_models, as_json=json_out
            )
            return
        if engine == "llamacpp":  # the GGUF is the model (--gguf, or --model FILE.gguf)
            from ceiling.predict.llamacpp import needs_gguf

            model = str(gguf) if gguf else model
            if not model:
                raise needs_gguf()
        if not model or not gpu:
            raise CeilingError(
                "predict needs --model and --gpu",
                fix="e.g. ceiling predict --model kimi-k2.5 --gpu rtx-pro-6000 --gpus 8 "
                "--link pcie5-switch --tp 8",
            )
        from pydantic import ValidationError

        from ceiling.predict.api import PredictRequest, predict
        from ceiling.predict.engine_options import parse_options

        try:
            req = PredictRequest(
                model=model,
                gpu=gpu,
                gpus=gpus,
                link=link,
                tp=tp,
                ep=ep,
                pp=pp,
                dp=dp,
                dcp=dcp,
                engine=engine,
                allreduce=allreduce,
                cuda_graphs=not no_cuda_graphs,
                batch=batch,
                context=context,
                prompt_len=prompt_len,
                kv_dtype=kv_dtype,
                weight_format=weight_format,
                profile=_str(profile),
                power_limit=power_limit,
                mem_clock=mem_clock,
                what_if=what_if,
                attention_backend=attention_backend,
                moe_backend=moe_backend,
                async_scheduling=async_scheduling,
                spec=spec,
                spec_tokens=spec_tokens,
                spec_draft_layers=spec_draft_layers,
                spec_acceptance_rate=spec_acceptance_rate,
                spec_acceptance_length=spec_acceptance_length,
                trtllm_options=parse_options(trtllm_option) or None,
                trtllm_config=_str(trtllm_config),
            )
        except ValidationError as exc:
            err = exc.errors()[0]
            raise CeilingError(
                f"--{'-'.join(str(x) for x in err['loc']).replace('_', '-')}: {err['msg']}",
                fix="see `ceiling predict --help`",
            ) from None
        pred = predict(req)
        if json_out:
            from ceiling.console import emit_json

            emit_json(pred)
        else:
            render.print_prediction(pred)


def _str(path: Path | None) -> str | None:
    """A file option as the request holds it (a string: requests are JSON)."""
    return str(path) if path is not None else None
