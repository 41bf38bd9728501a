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

from ceiling.errors import CeilingError
from ceiling.predict.datafiles import BackendPatterns, Pattern, kernels
from ceiling.predict.resolved import Setup
from ceiling.spec.deployment import EngineEntry, engines_table


def _backends() -> dict[str, dict[str, BackendPatterns]]:
    """engine -> attention | moe -> backend -> family -> patterns (kernels.yaml ``backends``)."""
    return kernels().backends


@cache
def kv_parallel_attention() -> tuple[str, ...]:
    """Table-key patterns of decode-attention kernels bounded by their KV splits per head."""
    return tuple(kernels().kv_parallel_attention)


def _norm(name: str) -> str:
    return name.strip().lower().replace("-", "_")


def engine_entry(engine: str) -> EngineEntry | None:
    """``engine``'s rules in ``data/predict/engines.yaml`` (None: an engine it does not list)."""
    return engines_table().get(engine)


def overlap_off_reason(s: Setup) -> str:
    """Why the engine runs its scheduler synchronously for this model by default ('' if not)."""
    entry = engine_entry(s.dep.engine)
    rules = entry.overlap_off if entry is not None else {}
    if "hybrid_linear_attention" in rules and any(
        layer.attention == "linear" for layer in s.spec.layers
    ):
        return str(rules["hybrid_linear_attention"]).strip()
    if "speculative" in rules and s.speculative:
        return str(rules["speculative"]).strip()
    return ""


def host_cost(s: Setup) -> tuple[float, str]:
    """(exposed host ms per step, why) for this setup."""
    e = engine_entry(s.dep.engine)
    async_ms = e.host_ms if e is not None else 0.0
    sync_ms = e.host_sync_ms if e is not None else async_ms
    src = e.host_source.strip() if e is not None else "estimate"
    choice = s.async_scheduling
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


def backend_patterns(s: Setup, kind: str, family: str) -> tuple[list[Pattern] | None, str]:
    """(table patterns for the user's backend, note) — (None, '') when the user chose none;
    (None, note) when the chosen backend has no rows for this family."""
    name = s.attention_backend if kind == "attention" else s.moe_backend
    if not name:
        return None, ""
    rules = ((_backends().get(s.dep.engine) or {}).get(kind) or {}).get(_norm(name)) or {}
    pats = rules.get(family) if kind == "attention" else rules.get("any")
    if not pats:
        return None, f"{kind} backend {name}: no table rows for {family} (default's evidence)"
    return [(str(a), str(b)) for a, b in pats], f"{kind} backend {name}"
