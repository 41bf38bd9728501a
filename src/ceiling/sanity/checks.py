"""Ask a running server the sanity questions and judge its answers (``ceiling sanity``).

Requests (all greedy, ``temperature: 0``, on ``/v1/completions``):
1. each known-answer prompt of ``data/sanity.yaml``: the continuation must contain the answer;
2. the fixed text with the engine's prompt log-probabilities (``Engine.prompt_logprobs_request``):
   its perplexity, against the family's band; and, where the weights are here and small, the
   same token ids through the reference forward pass on the CPU (``reference.py``);
3. one longer generation, end-of-sequence ignored where the engine can, for the
   degenerate-output detectors (``detect.py``) and the exact-length check.
Every check says ok / suspect / broken / skipped with its evidence; the verdict is the worst.
"""

from __future__ import annotations

import json
import math
import time
import urllib.error
from typing import Any

import ceiling.sanity.detect as detect
from ceiling.errors import CeilingError, ExitStatus
from ceiling.redact import redact
from ceiling.sanity.report import Check, Probe, SanityReport, Status, Verdict
from ceiling.sanity.spec import SanitySpec, load_spec
from ceiling.server.schema import ServedModel
from ceiling.server.sync import UNREACHABLE, SyncClient

_RANK = {"skipped": -1, "ok": 0, "suspect": 1, "broken": 2}


class _Server:
    """POSTs to one OpenAI-compatible server (:mod:`ceiling.server.policy`: the bench's API key,
    URL credentials as Basic auth, no proxy for loopback)."""

    def __init__(self, url: str, model: str, timeout_s: float) -> None:
        self.client = SyncClient(url, timeout_s=timeout_s)
        self.url, self.model, self.timeout_s = self.client.base, model, timeout_s

    def models(self) -> list[ServedModel]:
        """``/v1/models`` entries, failures reported as doctor's target reports them."""
        return self.client.models(command="ceiling")

    def complete(self, body: dict[str, Any]) -> dict[str, Any]:
        """The JSON answer; CeilingError for a refused request (with the server's message)."""
        data = json.dumps({"model": self.model, "temperature": 0, **body}).encode()
        headers = {"Content-Type": "application/json"}
        try:
            with self.client.open("/v1/completions", data, headers) as resp:
                return json.loads(resp.read().decode())
        except urllib.error.HTTPError as exc:
            detail = exc.read().decode(errors="replace")[:300]
            raise CeilingError(
                f"{self.url} refused a completion request: HTTP {exc.code}: {detail}",
                fix="check the model name and that the server serves /v1/completions",
                exit_code=ExitStatus.SERVER,
            ) from exc
        except UNREACHABLE as exc:
            raise CeilingError(
                f"no answer from {self.url}: {redact(str(exc))}",
                fix="start the server, or pass --variant FILE to let ceiling launch it",
                exit_code=ExitStatus.SERVER,
            ) from exc


def _generate(srv: _Server, engine: Any, pid: str, prompt: str, n: int, exact: bool) -> Probe:
    body: dict[str, Any] = {"prompt": prompt, "max_tokens": n, **engine.token_ids_request()}
    if exact and engine.ignore_eos_field:
        body[engine.ignore_eos_field] = True
    t0 = time.monotonic()
    try:
        ans = srv.complete(body)
    except CeilingError as exc:
        if "HTTP 400" not in exc.message or set(body) == {"prompt", "max_tokens"}:
            raise
        # an older or stricter server refused an extension field: ask in plain OpenAI
        body = {"prompt": prompt, "max_tokens": n}
        ans = srv.complete(body)
    choice = (ans.get("choices") or [{}])[0]
    ids = choice.get("token_ids")
    return Probe(
        id=pid,
        prompt=prompt,
        text=str(choice.get("text") or ""),
        token_ids=[int(i) for i in ids] if isinstance(ids, list) else None,
        finish_reason=choice.get("finish_reason"),
        completion_tokens=(ans.get("usage") or {}).get("completion_tokens"),
        max_tokens=n,
        forced_length=bool(engine.ignore_eos_field and engine.ignore_eos_field in body),
        seconds=round(time.monotonic() - t0, 3),
    )


def _band(value: float, ok_below: float, broken_above: float) -> Status:
    return "ok" if value <= ok_below else ("broken" if value > broken_above else "suspect")


def _known_answers(spec: SanitySpec, fam: Any, probes: list[Probe]) -> Check:
    right = sum(1 for p in probes if p.passed)
    share = right / len(probes) if probes else 0.0
    band = fam.known_answers
    status: Status = (
        "ok" if share >= band.ok_at_least else "broken" if share < band.broken_below else "suspect"
    )
    wrong = [p for p in probes if not p.passed]
    return Check(
        name="known answers",
        status=status,
        value=share,
        summary=f"{right} of {len(probes)} right (family {fam.name}: ok at "
        f"{band.ok_at_least:.0%}, broken below {band.broken_below:.0%})",
        evidence=[f"{p.prompt!r} -> {p.text!r} (expected {p.expect!r})" for p in wrong],
    )


def _perplexity(fam: Any, lp: Any, why: str | None) -> tuple[Check, float | None]:
    vals = [v for v in (lp.logprobs if lp else [])[1:] if v is not None]
    if not vals:
        return Check(
            name="perplexity", status="skipped", summary=why or "no log-probabilities"
        ), None
    ppl = math.exp(-sum(vals) / len(vals))
    band = fam.perplexity
    worst = sorted(
        (
            (v, t)
            for v, t in zip(lp.logprobs[1:], (lp.tokens or [""] * len(vals))[1:], strict=False)
            if v is not None
        ),
        key=lambda x: x[0],
    )[:3]
    return (
        Check(
            name="perplexity",
            status=_band(ppl, band.ok_below, band.broken_above),
            value=ppl,
            summary=f"{ppl:.4g} over {len(vals)} tokens of the fixed text (family {fam.name}: "
            f"ok below {band.ok_below:g}, broken above {band.broken_above:g}; {lp.source})",
            evidence=[f"least likely: {t!r} at {v:.3g} nats" for v, t in worst],
        ),
        ppl,
    )


def _reference(spec: SanitySpec, lp: Any, model_dir: str | None, dtype: str | None) -> Check:
    from ceiling.sanity import reference

    name = "reference"
    why = reference.why_not(model_dir, spec.reference.max_weight_bytes)
    if why is None and (lp is None or not lp.token_ids):
        why = "the server gave no token ids with its log-probabilities"
    if why is not None:
        return Check(name=name, status="skipped", summary=why)
    ref = reference.forward(str(model_dir), lp.token_ids, spec.reference.max_weight_bytes)
    pairs = [
        (s, r) for s, r in zip(lp.logprobs[1:], ref.logprobs[1:], strict=False) if s is not None
    ]
    diffs = [abs(s - r) for s, r in pairs if r is not None]
    mean = sum(diffs) / len(diffs) if diffs else math.inf
    tops = [
        (s, r)
        for s, r in zip((lp.top1_ids or [])[1:], ref.top1_ids[1:], strict=False)
        if s is not None and r is not None
    ]
    agree = sum(1 for s, r in tops if s == r) / len(tops) if tops else None
    rules = spec.reference
    tol = rules.tolerance(dtype)
    status: Status = _band(mean, tol, rules.broken_above)
    if agree is not None:
        if agree < rules.top1_broken_below:
            status = "broken"
        elif agree < rules.top1_ok_at_least and status == "ok":
            status = "suspect"
    top = f", top-1 token agrees at {agree:.0%} of positions" if agree is not None else ""
    return Check(
        name=name,
        status=status,
        value=mean,
        summary=f"mean |log p(server) - log p(reference)| {mean:.3g} nats over {len(diffs)} "
        f"tokens{top} (ok below {tol:g} for {dtype or 'an unknown dtype'}, broken above "
        f"{rules.broken_above:g}; the weights in {model_dir} on this CPU, {ref.seconds:.2g} s)",
        evidence=[f"largest difference {max(diffs):.3g} nats"] if diffs else [],
    )


def _degenerate(spec: SanitySpec, probes: list[Probe]) -> Check:
    signals = []
    for p in probes:
        for s in detect.scan(p.text, p.token_ids, p.completion_tokens, spec.degenerate):
            signals.append((p, s))
    if not signals:
        return Check(
            name="degenerate output",
            status="ok",
            summary=f"none in {len(probes)} answers (empty, one token forever, short loops, "
            "replacement characters)",
        )
    worst: Status = "broken" if any(s.status == "broken" for _, s in signals) else "suspect"
    kinds = sorted({s.detector for _, s in signals})
    return Check(
        name="degenerate output",
        status=worst,
        summary=f"{', '.join(kinds)} in {len({p.id for p, _ in signals})} of {len(probes)} answers",
        evidence=[f"{p.id}: {s.evidence}" for p, s in signals][:8],
    )


def _length(engine: Any, free: Probe) -> Check:
    if not free.forced_length:
        why = (
            "the server refused the end-of-sequence override"
            if engine.ignore_eos_field
            else f"{engine.display_name or 'this engine'} cannot generate past end-of-sequence"
        )
        return Check(name="finish reason", status="skipped", summary=why)
    sig = detect.length_signal(
        free.max_tokens, free.completion_tokens, free.finish_reason, free.text
    )
    if sig is None:
        return Check(
            name="finish reason",
            status="ok",
            summary=f"asked for {free.max_tokens} tokens, got {free.completion_tokens}, "
            "finish_reason length",
        )
    return Check(name="finish reason", status=sig.status, summary=sig.evidence)


def _headline(verdict: Verdict, checks: list[Check]) -> str:
    bad = [c for c in checks if c.status in ("broken", "suspect")]
    if verdict == "ok":
        ran = [c for c in checks if c.status == "ok"]
        return "ok: " + "; ".join(f"{c.name}: {c.summary.split(' (')[0]}" for c in ran)
    worst = [c for c in bad if c.status == verdict] + [c for c in bad if c.status != verdict]
    return f"{verdict}: " + "; ".join(f"{c.name}: {c.summary.split(' (')[0]}" for c in worst)


def check_server(
    url: str,
    model: str,
    engine: str | None = None,
    model_dir: str | None = None,
    dtype: str | None = None,
    reference: bool = True,
    timeout_s: float = 60.0,
    spec: SanitySpec | None = None,
) -> SanityReport:
    """Ask the running server at ``url`` (serving ``model``) every sanity question."""
    from ceiling.engines import get_engine
    from ceiling.engines.base import Engine

    spec = spec or load_spec()
    t0 = time.monotonic()
    try:
        adapter = get_engine(engine) if engine else Engine()
    except CeilingError:
        adapter = Engine()  # an OpenAI-compatible server of an engine we do not know
    srv = _Server(url, model, timeout_s)
    fam, why_fam = spec.family(model_dir, model)
    probes = []
    for ka in spec.known_answers:
        p = _generate(srv, adapter, ka.id, ka.prompt, ka.max_tokens, exact=False)
        p.expect, p.passed = ka.contains, ka.contains in p.text
        probes.append(p)
    g = spec.free_generation
    free = _generate(srv, adapter, "free", g.prompt, g.max_tokens, exact=True)
    lp, lp_why = None, None
    try:
        ans = srv.complete(
            {"prompt": spec.perplexity.text, "max_tokens": 1, **adapter.prompt_logprobs_request()}
        )
        lp = adapter.read_prompt_logprobs(ans)
        if lp is None:
            lp_why = "the server returned no prompt log-probabilities"
    except CeilingError as exc:
        lp_why = f"prompt log-probabilities refused: {exc.message}"
    if lp_why and adapter.prompt_logprobs_hint:
        lp_why += f" ({adapter.prompt_logprobs_hint})"
    ppl_check, ppl = _perplexity(fam, lp, lp_why)
    checks = [_known_answers(spec, fam, probes), ppl_check]
    if reference:
        checks.append(_reference(spec, lp, model_dir, dtype))
    else:
        checks.append(Check(name="reference", status="skipped", summary="turned off"))
    checks += [_degenerate(spec, [*probes, free]), _length(adapter, free)]
    rank = max((_RANK[c.status] for c in checks), default=1)
    verdicts: dict[int, Verdict] = {0: "ok", 1: "suspect", 2: "broken"}
    verdict = verdicts[max(rank, 0)]
    return SanityReport(
        url=srv.url,
        model=model,
        engine=engine,
        model_dir=model_dir,
        dtype=dtype,
        family=fam.name,
        family_reason=why_fam,
        verdict=verdict,
        headline=_headline(verdict, checks),
        checks=checks,
        probes=[*probes, free],
        perplexity=ppl,
        seconds=round(time.monotonic() - t0, 2),
    )
