"""The sanity gate: is the server computing the model, or fast garbage? (``ceiling sanity``)

``spec.py`` reads what to ask and the per-family thresholds (``data/sanity.yaml``);
``checks.py`` asks a running server (known answers, prompt perplexity, degenerate output, exact
length) and judges; ``reference.py`` is the optional CPU forward pass of the same weights;
``detect.py`` holds the degenerate-output detectors; ``run.py`` is the command and the gate
that ``doctor`` and ``sweep`` run first. See docs/sanity.md.
"""

from ceiling.sanity.checks import Check, Probe, SanityReport, check_server
from ceiling.sanity.run import SanityBroken, SanityConfig, doctor_gate, run_sanity

__all__ = [
    "Check",
    "Probe",
    "SanityBroken",
    "SanityConfig",
    "SanityReport",
    "check_server",
    "doctor_gate",
    "run_sanity",
]
