"""What the sanity gate asks and how it judges: ``data/sanity.yaml`` as typed objects.

Thresholds are kept per model family (a demo model that knows its texts by heart must score
far better than "any competent model"); the family is recognised from the model directory
(a marker file, ``config.json``) or from the served model name.
"""

from __future__ import annotations

import re
from functools import cache
from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from ceiling.errors import CeilingError
from ceiling.inputs import read_json, read_text
from ceiling.spec._data import load_yaml

DATA_FILE = Path(__file__).resolve().parents[1] / "data" / "sanity.yaml"


class _Strict(BaseModel):
    """The sanity spec's blocks: an unknown key is an error (a typo is not a default)."""

    model_config = ConfigDict(extra="forbid")


class KnownAnswer(_Strict):
    id: str
    prompt: str
    contains: str
    max_tokens: int = 8


class PerplexityText(_Strict):
    text: str


class FreeGeneration(_Strict):
    prompt: str
    max_tokens: int = 32


class DegenerateRules(_Strict):
    same_token_run: int = 12
    loop_max_period: int = 4
    loop_min_share: float = 0.75
    loop_min_tokens: int = 16
    replacement_chars_broken: int = 3


class ReferenceRules(_Strict):
    max_weight_bytes: int = 1 << 30
    ok_below: dict[str, float] = Field(default_factory=lambda: {"float32": 0.02})
    broken_above: float = 0.5
    top1_ok_at_least: float = 0.9
    top1_broken_below: float = 0.6

    def tolerance(self, dtype: str | None) -> float:
        """The ok bound for a server computing in ``dtype`` (the loosest one when unknown)."""
        if dtype and dtype in self.ok_below:
            return self.ok_below[dtype]
        return max(self.ok_below.values())


class Band(_Strict):
    """ok below ``ok_below``, broken above ``broken_above``, suspect in between."""

    ok_below: float
    broken_above: float


class PassBand(_Strict):
    """ok at or above ``ok_at_least`` of the answers right, broken below ``broken_below``."""

    ok_at_least: float
    broken_below: float


class FamilyMatch(_Strict):
    marker: str | None = None
    model_type: str | None = None
    architecture: str | None = None
    name: str | None = None


class Family(_Strict):
    name: str
    match: FamilyMatch = Field(default_factory=FamilyMatch)
    perplexity: Band
    known_answers: PassBand


class SanitySpec(_Strict):
    schema_version: int = 1
    known_answers: list[KnownAnswer]
    perplexity: PerplexityText
    free_generation: FreeGeneration
    degenerate: DegenerateRules = Field(default_factory=DegenerateRules)
    reference: ReferenceRules = Field(default_factory=ReferenceRules)
    families: list[Family]

    def family(self, model_dir: str | None, served_name: str | None) -> tuple[Family, str]:
        """The family whose rule matches first, and why it matched (``default`` otherwise)."""
        config = _config(model_dir)
        for fam in self.families:
            m = fam.match
            if m.marker and model_dir and (Path(model_dir) / m.marker).is_file():
                return fam, f"{m.marker} in {model_dir}"
            if m.model_type and config.get("model_type") == m.model_type:
                return fam, f"model_type {m.model_type} in config.json"
            archs = config.get("architectures")
            if m.architecture and isinstance(archs, list) and m.architecture in archs:
                return fam, f"architecture {m.architecture} in config.json"
            if m.name and served_name and re.search(m.name, served_name, re.I):
                return fam, f"served model name {served_name!r}"
        default = next((f for f in self.families if f.name == "default"), self.families[-1])
        return default, "no family rule matched"


def _config(model_dir: str | None) -> dict[str, object]:
    if not model_dir:
        return {}
    try:  # a config that cannot be read only means no family rule matches by it
        data = read_json(Path(model_dir) / "config.json", "config.json", fix="-")
    except CeilingError:
        return {}
    return data if isinstance(data, dict) else {}


@cache
def load_spec(path: str | None = None) -> SanitySpec:
    """``data/sanity.yaml`` (or another file of the same shape)."""
    if path is None:
        return load_yaml("sanity.yaml", schema=SanitySpec)
    import yaml

    fix = "pass a file of the shape of ceiling's data/sanity.yaml"
    try:
        return SanitySpec.model_validate(yaml.safe_load(read_text(path, "sanity spec", fix=fix)))
    except (yaml.YAMLError, ValidationError) as exc:
        raise CeilingError(
            f"sanity spec {path} is not a sanity spec ({type(exc).__name__}: "
            f"{str(exc).splitlines()[0]})",
            fix=fix,
        ) from None
