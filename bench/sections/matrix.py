"""Section `matrix`: the stall matrix of issue 23 in full (`tests/it/matrix.rs`,
`matrix::full`): every scenario on ext4, XFS and btrfs loop filesystems and a FUSE
server, each stall of 2 s or more beside the class of the kernel's own stacks.

The scenarios, the tracefs witness and the classes live in the test; this section runs
it (release build, `cargo test --release --test it matrix::full -- --ignored`), reads the
rows it writes (`STALLWATCH_MATRIX_JSON`) and turns them into the table and goals of a
bench run. The story of each cell: docs/stall-matrix.md.
"""

import json
import os
import signal
import subprocess
import tempfile
import time
from pathlib import Path

from ..harness import MeasureError
from ..results import Goal
from ..tables import Table
from . import Section

REPO = Path(__file__).resolve().parents[2]
FS_ORDER = ("ext4", "xfs", "btrfs", "fuse")
AGREEMENT_GOAL = 0.95


COMMAND = ["cargo", "test", "--release", "--test", "it", "matrix::full", "--", "--ignored",
           "--nocapture"]


TIMEOUT = 1800
DIRTY = [Path("/proc/sys/vm") / n for n in
         ("dirty_ratio", "dirty_bytes", "dirty_background_ratio", "dirty_background_bytes")]


def restore_dirty(saved):
    """Writes the vm.dirty_* sysctls back if they differ from `saved`. The test restores
    them itself on every exit path but one: killed at the timeout, it cannot. A ratio and
    its bytes exclude each other (writing one zeroes the other), so the nonzero one of
    each pair is written."""
    now = [p.read_text().strip() for p in DIRTY]
    if now == saved:
        return
    for i in (0, 2):
        ratio, size = saved[i], saved[i + 1]
        if size != "0":
            DIRTY[i + 1].write_text(size)
        else:
            DIRTY[i].write_text(ratio)


def run(env, log):
    """matrix::full in a process group of its own, killed whole at the timeout."""
    with open(log, "w") as f:
        p = subprocess.Popen(COMMAND, cwd=REPO, env=env, stdout=f, stderr=subprocess.STDOUT,
                             start_new_session=True)
        try:
            return p.wait(timeout=TIMEOUT)
        except subprocess.TimeoutExpired:
            os.killpg(p.pid, signal.SIGKILL)
            p.wait()
            raise MeasureError(f"matrix::full still running after {TIMEOUT} s, killed; a loop "
                               f"device or frozen filesystem of its own may be left (see {log})")


def measure(ctx):
    saved = [p.read_text().strip() for p in DIRTY]
    with tempfile.TemporaryDirectory(prefix="bench-matrix-") as tmp:
        out = Path(tmp) / "matrix.json"
        env = dict(os.environ, STALLWATCH_MATRIX_JSON=str(out))
        if ctx.args.matrix_only:
            env["STALLWATCH_MATRIX_ONLY"] = ctx.args.matrix_only
        log = Path(ctx.work) / "matrix.log"
        t0 = time.monotonic()
        try:
            rc = run(env, log)
        finally:
            restore_dirty(saved)
        elapsed = time.monotonic() - t0
        if not out.exists():
            tail = log.read_text(errors="replace").splitlines()[-15:]
            raise MeasureError(f"matrix::full wrote no rows (exit {rc}); its log ends:\n"
                               + "\n".join(tail))
        data = json.loads(out.read_text())
    data["seconds"] = elapsed
    data["exit"] = rc
    return data, goals(data)


def summary(data):
    rows = data["rows"]
    named = sum(r["named"] for r in rows)
    agree = sum(r["agrees"] for r in rows)
    return len(rows), named, agree


def goals(data):
    n, named, agree = summary(data)
    share = agree / n if n else 0.0
    return [
        Goal("stalls >= 2 s with a named cause (not other/unknown): all",
             f"{named} of {n}", n > 0 and named == n),
        Goal(f"the agent's cause = the kernel stacks' class >= {AGREEMENT_GOAL:.0%}",
             f"{agree} of {n} ({share:.0%})", n > 0 and share >= AGREEMENT_GOAL, share),
    ]


def cell_text(rows):
    if not rows:
        return "no stall >= 2 s"
    agree = sum(r["agrees"] for r in rows)
    mixed = sum(r["mixed"] for r in rows)
    causes = {}
    for r in rows:
        causes[r["cause"]] = causes.get(r["cause"], 0) + 1
    what = ", ".join(f"{c} x{k}" if k > 1 else c for c, k in sorted(causes.items()))
    return f"{len(rows)}: {what}; agree {agree}/{len(rows)}" + (f" ({mixed} mixed)" if mixed else "")


def tables(data, params):
    scenarios = []
    for c in data["cells"]:
        if c["scenario"] not in scenarios:
            scenarios.append(c["scenario"])
    run = {(c["scenario"], c["fs"]) for c in data["cells"]}
    fss = [f for f in FS_ORDER if any(c["fs"] == f for c in data["cells"])]
    body = []
    for s in scenarios:
        body.append((s, *(cell_text([r for r in data["rows"] if r["scenario"] == s and r["fs"] == f])
                          if (s, f) in run else "-" for f in fss)))
    n, named, agree = summary(data)
    notes = [f"{n} stalls >= 2 s, {named} with a named cause, {agree} agree with the kernel's "
             f"stack; {data['seconds']:.0f} s, matrix::full exit {data['exit']}"
             + (f", cells {params['matrix_only']}" if params.get("matrix_only") else "")]
    for r in data["rows"]:
        if not r["agrees"] or not r["named"]:
            k = r["kernel"] or {}
            shares = ", ".join(f"{c} {v:.1f} s" for c, v in (k.get("shares") or {}).items())
            notes.append(f"{r['scenario']} {r['fs']} {r['mode']}:{r['op']} {r['seconds']:.1f} s: "
                         f"agent {r['cause']} at {r['symbol']}, kernel {k.get('class', '-')} at "
                         f"{k.get('frame', '-')} ({shares}); stack: "
                         + " < ".join(k.get("stack") or []))
    return [Table(title="Stall matrix",
                  caption="stalls >= 2 s per scenario and filesystem: the agent's causes, and how "
                          "many agree with the class of the kernel's sched_switch stacks",
                  head=("scenario", *fss), rows=body, notes=notes)]


SECTION = Section(
    name="matrix", aliases=(),
    summary="the stall matrix in full (tests/it/matrix.rs matrix::full): causes against the "
            "kernel's stacks on ext4, XFS, btrfs and FUSE",
    params=("matrix_only",), default=False, measure=measure, tables=tables)
