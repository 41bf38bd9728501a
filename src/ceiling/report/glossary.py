"""The component names a report uses, each in plain words, said once per report.

The verdict and the attribution name the parts of a decode step by short words (``weights``,
``launch``...) that are predict's component names; a reader who has not read predict's docs
gets each one explained once, under the verdict (``glossary_lines``).
"""

from __future__ import annotations

import re

from ceiling.diagnose.attribute import UNEXPLAINED_LABEL

#: component name -> what it is, in plain words (predict's components, then the remainder)
MEANING: dict[str, str] = {
    "weights": "reading the model's weights from GPU (or CPU) memory, once per decode step: "
    "memory bandwidth times the bytes of the weight format",
    "kv": "reading the KV cache (the keys and values of every token in the context) each step",
    "compute": "the arithmetic itself (matrix multiplies) at the hardware's peak rate",
    "collectives": "the GPUs exchanging partial results every layer (allreduce, all-to-all) "
    "in this parallel layout",
    "launch": "fixed kernel costs and inefficiency vs the best known kernels: the start-up "
    "time of every GPU kernel, plus what this engine's kernels take beyond the best known ones",
    "host": "CPU time in each step outside the GPU's work: the engine's scheduler, sampling, "
    "Python",
    UNEXPLAINED_LABEL: "the measured step minus everything predicted: kernels slower than "
    "modelled and host or framework time that no component accounts for",
}


def _used(name: str, text: str) -> bool:
    return re.search(rf"(?<![\w/-]){re.escape(name)}(?![\w/-])", text, re.IGNORECASE) is not None


def glossary_lines(text: str) -> list[str]:
    """A short section explaining each component name that ``text`` (the report) uses."""
    names = [n for n in MEANING if _used(n, text)]
    if not names:
        return []
    out = ["## What the names mean", ""]
    out += [f"- **{name}**: {MEANING[name]}." for name in names]
    return [*out, ""]
