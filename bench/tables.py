"""Tables as sections describe them, and their two renderings: aligned text for the
terminal (the layout the bench has always printed) and Markdown for BENCHMARKS.md.

A section turns its result into a list of `Table`s; it never prints.
"""

from dataclasses import dataclass, field


@dataclass
class Table:
    """A title and caption, lines under them, a table (optional), notes after it.

    The terminal prints "title: caption" on one line, as the bench always has;
    Markdown makes the title a heading and the caption a paragraph."""

    title: str
    caption: str = ""
    head: list = field(default_factory=list)
    rows: list = field(default_factory=list)
    intro: list = field(default_factory=list)
    notes: list = field(default_factory=list)


def _aligned(head, rows):
    """Columns padded to their widest cell; the first left-aligned, the rest right."""
    w = [max(len(str(x)) for x in col) for col in zip(head, *rows)]

    def line(r):
        return "  ".join(str(x).ljust(w[i]) if i == 0 else str(x).rjust(w[i])
                         for i, x in enumerate(r))

    return [line(head), "  ".join("-" * x for x in w), *(line(r) for r in rows)]


def text(tables):
    """The tables as the terminal shows them, one blank line between them."""
    out = []
    for t in tables:
        out.append("")
        out.append(f"{t.title}: {t.caption}" if t.caption else t.title)
        out.extend(f"    {ln}" for ln in t.intro)
        if t.head:
            out.extend(_aligned(t.head, t.rows))
        out.extend(f"   {ln}" for ln in t.notes)
    return "\n".join(out)


def _cell(x):
    return str(x).replace("|", "\\|")


def markdown(tables, heading="####"):
    """The tables as Markdown: the title a heading, intro and notes bullets."""
    out = []
    for t in tables:
        out += ["", f"{heading} {t.title}", ""]
        if t.caption:
            out += [t.caption + ".", ""]
        if t.intro:
            out += [f"- {ln}" for ln in t.intro] + [""]
        if t.head:
            out.append("| " + " | ".join(_cell(h) for h in t.head) + " |")
            out.append("|" + "|".join("---" for _ in t.head) + "|")
            out += ["| " + " | ".join(_cell(x) for x in r) + " |" for r in t.rows]
            out.append("")
        out += [f"- {ln}" for ln in t.notes]
    return "\n".join(out).strip("\n") + "\n"
