"""The sections of the bench, in the order a run takes them.

Each section is a module with a `SECTION`: its name, the digit it had before it had a
name (`--only 1` still works), the command-line options that are its parameters, a
`measure(ctx)` returning (data, goals) and a `tables(data, params)` that renders its
result (live or read back from JSON) as `Table`s.
"""

from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

from ..harness import loop_filesystems


@dataclass(frozen=True)
class Section:
    name: str
    aliases: tuple
    summary: str
    params: tuple
    default: bool
    measure: Callable
    tables: Callable


@dataclass
class Context:
    """What a section measures with: the options, the work directory, the private
    copy of the binary, and the run's eight loop filesystems (made on first use)."""

    args: object
    work: Path
    binary: Path
    _loops: list = field(default=None, repr=False)
    tmpfs: list = field(default=None, repr=False)

    def loops(self):
        if self._loops is None:
            self._loops = loop_filesystems(self.work)
        return self._loops

    def params(self, section):
        return {k: getattr(self.args, k) for k in section.params}


def all_sections():
    """Every section, in run order (that of the numbered bench: 1, 2+3, 5, 4, 6, 7)."""
    from . import accuracy, agent, append, detection, floor, matrix, overhead, scale, series
    return [accuracy.SECTION, overhead.SECTION, series.SECTION, detection.SECTION,
            scale.SECTION, append.SECTION, agent.SECTION, floor.SECTION, matrix.SECTION]


def by_name():
    """Every name and alias to its section."""
    out = {}
    for s in all_sections():
        for n in (s.name, *s.aliases):
            out[n] = s
    return out
