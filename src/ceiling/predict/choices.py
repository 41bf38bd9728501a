"""The engine's run-time choices that change a decode step: its host loop and its backends.

- ``host_cost``: the per-step CPU time the engine leaves exposed. Its async/overlap scheduler
  hides most of it (``host_ms`` in ``data/predict/engines.yaml``); when the scheduler runs
  synchronously — the user turned it off, or the engine turns it off for this model
  (``overlap_off``: SGLang on hybrid linear-attention models with its default mamba radix
  cache strategy) — the whole step's CPU work shows (``host_sync_ms``). Both are measured
  where the file says so.
- ``backend_patterns``: a user-chosen attention or MoE backend (the engine's own flag value)
  -> the aiconfigurator table rows that measure it (``data/predict/kernels.yaml`` ``backends``).
  ``check_backends`` refuses a name the engine does not have.
"""

from __future__ import annotations

from functools import cache
from typing import Any

from ceiling.errors import CeilingError
from ceiling.spec._data import load_yaml


@cache
def _engines() -> dict[str, Any]:
    return load_yaml("predict/engines.yaml")


@cache
def _backends() -> dict[str, Any]:
    return load_yaml("predict/kernels.yaml").get("backends") or {}


@cache
def kv_parallel_attention() -> tuple[str, ...]:
    """Table-key patterns of decode-attention kernels bounded by their KV splits per head."""
    return tuple(load_yaml("predict/kernels.yaml").get("kv_parallel_attention") or ())


def _norm(name: str) -> str:
    return name.strip().lower().replace("-", "_")


def engine_rule(engine: str, name: str) -> dict[str, Any]:
    """One named rule of ``engine`` in ``data/predict/engines.yaml`` ({} when it has none)."""
    rule = (_engines().get(engine) or {}).get(name)
    return dict(rule) if isinstance(rule, dict) else {}


def overlap_off_reason(s: Any) -> str:
    """Why the engine runs its scheduler synchronously for this model by default ('' if not)."""
    rules = engine_rule(s.dep.engine, "overlap_off")
    if "hybrid_linear_attention" in rules and any(
        layer.attention == "linear" for layer in s.spec.layers
    ):
        return str(rules["hybrid_linear_attention"]).strip()
    return ""


def host_cost(s: Any) -> tuple[float, str]:
    """(exposed host ms per step, why) for this setup."""
    e = _engines().get(s.dep.engine) or {}
    async_ms = float(e.get("host_ms", 0.0))
    sync_ms = float(e.get("host_sync_ms", async_ms))
    src = str(e.get("host_source", "estimate")).strip()
    choice = getattr(s, "async_scheduling", None)
    if choice is False:
        return sync_ms, f"scheduler synchronous (--no-async-scheduling): {sync_ms} ms; {src}"
    if choice is None:
        why = overlap_off_reason(s)
        if why:
            return sync_ms, f"{s.dep.engine} turns its overlap scheduler off here: {why}"
    return async_ms, f"{s.dep.engine} async/overlap scheduler: {async_ms} ms exposed; {src}"


def known_backends(engine: str, kind: str) -> list[str]:
    """The backend names of ``kind`` (attention | moe) predict knows for ``engine``."""
    return list((_backends().get(engine) or {}).get(kind) or {})


def check_backends(engine: str, attention: str | None, moe: str | None) -> None:
    """Refuse a backend name the engine does not have (a confident wrong answer otherwise)."""
    table = _backends().get(engine) or {}
    for kind, name in (("attention", attention), ("moe", moe)):
        if not name:
            continue
        known = table.get(kind) or {}
        if _norm(name) not in known:
            flag = "--attention-backend" if kind == "attention" else "--moe-backend"
            raise CeilingError(
                f"{flag} {name}: not a {kind} backend of {engine} that predict knows",
                fix="one of: " + (", ".join(known) or f"(none for {engine}; drop {flag})"),
            )


def backend_patterns(s: Any, kind: str, family: str) -> tuple[list[tuple[str, str]] | None, str]:
    """(table patterns for the user's backend, note) — (None, '') when the user chose none;
    (None, note) when the chosen backend has no rows for this family."""
    name = getattr(s, "attention_backend" if kind == "attention" else "moe_backend", None)
    if not name:
        return None, ""
    rules = ((_backends().get(s.dep.engine) or {}).get(kind) or {}).get(_norm(name)) or {}
    pats = rules.get(family) if kind == "attention" else rules.get("any")
    if not pats:
        return None, f"{kind} backend {name}: no table rows for {family} (default's evidence)"
    return [(str(a), str(b)) for a, b in pats], f"{kind} backend {name}"
