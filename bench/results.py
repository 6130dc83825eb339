"""What a run of the bench produces: one `SectionResult` per section, inside a `Run`.

Both are dataclasses and serialise to JSON (`Run.to_json`); `Run.from_json` reads one
back, so every table can be rendered again from a saved run (`bench/run.py --render`).
A section's `data` holds only JSON types (dicts with string keys, lists, numbers,
strings, None); missing numbers are written as null. A run that fails after some
sections is written with what they measured and `complete: false`.
"""

import json
import math
from dataclasses import asdict, dataclass, field


@dataclass
class Goal:
    """One goal of a section: what it asks, the figure measured, whether it is met."""

    goal: str
    measured: str
    ok: bool
    value: float | None = None


@dataclass
class SectionResult:
    """What one section measured: its parameters, its figures, its goals."""

    section: str
    params: dict
    data: dict
    goals: list = field(default_factory=list)
    started: str = ""
    seconds: float = 0.0


@dataclass
class Run:
    """A whole run: where and when it ran, and every section's result."""

    commit: str
    date: str
    machine: dict
    versions: dict
    binary: str
    command: str
    sections: list = field(default_factory=list)
    wall_seconds: float = 0.0
    complete: bool = False

    def goals(self):
        return [g for s in self.sections for g in s.goals]

    def to_json(self):
        return json.dumps(plain(asdict(self)), indent=1, ensure_ascii=False,
                          allow_nan=False) + "\n"

    @classmethod
    def from_json(cls, text):
        d = json.loads(text)
        sections = [SectionResult(**{**s, "goals": [Goal(**g) for g in s["goals"]]})
                    for s in d.pop("sections")]
        return cls(**d, sections=sections)


def plain(x):
    """x with tuples as lists and NaN/inf as None: what JSON can hold."""
    if isinstance(x, dict):
        return {str(k): plain(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [plain(v) for v in x]
    if isinstance(x, float) and not math.isfinite(x):
        return None
    return x


def through_json(data):
    """data as it reads after a JSON round trip, so that a section's tables are
    rendered alike from a live run and from a saved file."""
    return json.loads(json.dumps(plain(data)))
