"""Where a run's prompts come from: a dataset file (JSONL or ShareGPT) or the synthetic
workload (:mod:`ceiling.bench.workloads`), built once before the first measured request."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from ceiling.bench.client import Client
from ceiling.bench.config import BenchConfig
from ceiling.bench.sharegpt import Exchange, read_exchanges, sharegpt_prompts
from ceiling.bench.workloads import Prompt, SyntheticSpec, load_jsonl, synthetic_prompts
from ceiling.choices import DatasetFormat
from ceiling.inputs import read_text

#: Prompt pool when the request count is open (``--duration``); reused cyclically beyond it.
OPEN_POOL = 512


@dataclass
class Dataset:
    """A dataset file, read and checked: JSONL prompts, or ShareGPT exchanges (sampled and
    counted against the server once it is known)."""

    path: Path
    format: str  # "jsonl" or "sharegpt": what was read (auto-detection resolved)
    prompts: list[Prompt] | None = None
    exchanges: list[Exchange] | None = None


def read_dataset(path: Path, fmt: DatasetFormat = "auto") -> Dataset:
    """Read ``path`` as ``fmt``; ``auto``: ShareGPT when the file is a JSON list whose first
    object holds ``conversations``, else JSONL (a JSONL line is an object, never a list)."""
    text = read_text(path, "--dataset", fix="pass a JSONL or ShareGPT JSON file")
    exchanges = read_exchanges(text, path, fmt) if fmt != "jsonl" else None
    if exchanges is not None:
        return Dataset(path, "sharegpt", exchanges=exchanges)
    return Dataset(path, "jsonl", prompts=load_jsonl(path, text))


def pool_size(cfg: BenchConfig) -> int:
    """Prompts (sessions) the run sends: warm-up + every level of every repeat, or
    :data:`OPEN_POOL` when a level's count is open (then reused cyclically)."""
    counts = [cfg.requests_for(lv) for lv in cfg.levels()]
    if any(c is None for c in counts):
        return OPEN_POOL
    return cfg.warmup + cfg.repeat * sum(c for c in counts if c is not None)


async def build_prompts(
    cfg: BenchConfig, client: Client, model: str, max_tokens: int, dataset: Dataset | None
) -> tuple[list[Prompt], bool, str]:
    """The run's prompts, whether reusing them is expected (a dataset), and how their
    lengths were set (``dataset``, ``tokenize`` or ``approximate``). ``max_tokens``: the
    run's output budget, the centre of ``--output-range``."""
    if dataset is not None and dataset.prompts is not None:
        return dataset.prompts, True, "dataset"
    if dataset is not None and dataset.exchanges is not None:
        prompts, source = await sharegpt_prompts(
            client,
            model,
            dataset.exchanges,
            pool_size(cfg),
            cfg.seed,
            cfg.max_tokens,
            dataset.path,
        )
        return prompts, True, source
    spec = SyntheticSpec(
        input_len=cfg.input_len,
        input_range=cfg.input_range,
        prefix_len=cfg.prefix_len,
        turns=cfg.turns,
        output_len=max_tokens,
        output_range=cfg.output_range,
    )
    prompts, source = await synthetic_prompts(client, model, pool_size(cfg), spec, cfg.seed)
    return prompts, False, source
