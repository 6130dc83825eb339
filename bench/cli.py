"""stallwatch benchmark: accuracy, overhead, scrape cost, detection delay, series; on
request, cost at 64 targets, the accuracy of the append probe, and the agent alone.

Run as root, from anywhere:

    bench/run.py                       # accuracy, overhead (+ scrape), series, detection: ~4.5 min
    bench/run.py --quick               # smoke run (short windows, fewer rounds), under 1 minute
    bench/run.py --only scale,append   # 64 targets, and append against fio's etcd job
    bench/run.py --only all --json run.json
    bench/run.py --render run.json     # the Markdown tables of a saved run (BENCHMARKS.md)

(`python3 -m bench ...` from the repository root is the same.) Sections are named;
the digits of the numbered bench still work (`--only 6,7`).

It needs the release binary (cargo build --release), fio, ioping, strace, curl,
prometheus-node-exporter, mkfs.xfs, mkfs.ext4, losetup, fsfreeze. It creates its own
loop filesystems in a temporary directory and undoes everything (thaw, stop its own
processes by pid, unmount, detach, delete) on every exit path, Ctrl-C included.

Exit status: 0 when the run completed (goals met or not; the tables say which, and
--strict turns a missed goal into 1), 1 when a measurement could not be taken, 2 on a
setup failure (missing tool, not root, agent does not start).

Everything is measured side by side and interleaved: rounds rotate the order of the
tools and alternate the filesystems, scrape requests alternate the servers in blocks,
so drift on a shared machine hits every column alike. Method and results: BENCHMARKS.md.
"""

import argparse
import os
import shutil
import signal
import sys
import tempfile
import time
from pathlib import Path

from . import tables as render
from .harness import TOOLS, UNDO, MeasureError, SetupError
from .machine import REPO, binary_identity, commit, machine, versions
from .results import Run, SectionResult, through_json
from .sections import Context, all_sections, by_name
from .tables import Table

QUICK = {"rounds": 2, "count": 100, "window": 20, "requests": 100, "freezes": 1,
         "b2b_rounds": 1, "b2b_count": 300, "scale_window": 20, "frozen_requests": 50,
         "format_requests": 100,
         "append_rounds": 2, "append_count": 100, "append_b2b_rounds": 1,
         "append_b2b_count": 300, "agent_window": 15, "agent_freeze": 2,
         "floor_rounds": 2, "floor_window": 10}


def sections_help():
    lines = ["sections (--only NAME,NAME; in parentheses: aliases, and the digits of the "
             "numbered bench):"]
    for s in all_sections():
        names = s.name + (f" ({', '.join(s.aliases)})" if s.aliases else "")
        lines.append(f"  {names:<24} {s.summary}")
    lines.append("  all                      every section")
    lines.append("default: " + ",".join(s.name for s in all_sections() if s.default))
    return "\n".join(lines)


def parser():
    ap = argparse.ArgumentParser(prog="bench/run.py", description=__doc__, epilog=sections_help(),
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    opt = ap.add_argument
    opt("--bin", type=Path, default=REPO / "target" / "release" / "stallwatch",
        help="the stallwatch binary (default: target/release/stallwatch)")
    opt("--only", default=None, help="sections to run, by name (or digit), comma-separated")
    opt("--quick", action="store_true", help="smoke run: short windows, few rounds")
    opt("--json", type=Path, metavar="FILE", help="write every result of the run to FILE (also on a failure, "
        "with the sections done and complete: false)")
    opt("--render", type=Path, metavar="FILE", help="print the tables of a --json FILE; run nothing")
    opt("--format", choices=("md", "text"), default="md", help="of --render (default md)")
    opt("--strict", action="store_true", help="exit 1 when a goal is missed")
    opt("--rounds", type=int, default=12, help="accuracy: paced rounds (default 12)")
    opt("--count", type=int, default=200, help="accuracy: requests per paced run (default 200)")
    opt("--b2b-rounds", type=int, default=3, help="accuracy: back-to-back rounds (default 3)")
    opt("--b2b-count", type=int, default=1000, help="accuracy: requests per back-to-back run")
    opt("--window", type=float, default=120, help="overhead: window, s (default 120)")
    opt("--requests", type=int, default=500, help="overhead, scale: scrape requests per row (500)")
    opt("--freezes", type=int, default=3, help="detection: fsfreeze trials (default 3)")
    opt("--scale-targets", type=int, default=64,
        help="scale: targets, the 8 loop filesystems and tmpfs mounts (default 64)")
    opt("--scale-window", type=float, default=90, help="scale: window per interval, s (90)")
    opt("--scale-frozen", type=int, default=4, help="scale: loop targets frozen (default 4)")
    opt("--frozen-requests", type=int, default=200,
        help="scale: scrape requests per row while frozen (default 200)")
    opt("--format-requests", type=int, default=500,
        help="scale: scrape requests per format and encoding, 8 and 64 targets (default 500)")
    opt("--append-rounds", type=int, default=12, help="append: paced rounds (default 12)")
    opt("--append-count", type=int, default=400, help="append: requests per paced run (400)")
    opt("--append-b2b-rounds", type=int, default=12, help="append: back-to-back rounds (12)")
    opt("--append-b2b-count", type=int, default=3000,
        help="append: requests per back-to-back run (default 3000)")
    opt("--append-warmup", type=int, choices=(0, 1), default=1,
        help="append: 1 (default): one unmeasured back-to-back run of every tool on both "
             "filesystems first; 0: none")
    opt("--agent-window", type=float, default=60, help="agent: window, s (default 60)")
    opt("--agent-freeze", type=float, default=5, help="agent: freeze held, s (default 5)")
    opt("--floor-rounds", type=int, default=3,
        help="floor: rounds of the agent and the floor program, order alternating (default 3)")
    opt("--floor-window", type=float, default=60, help="floor: window per process and round, s (60)")
    opt("--floor-compare", type=str, metavar="BIN", default=None,
        help="floor: another stallwatch binary (e.g. the build before a change), measured "
             "in the same rounds as a third process")
    opt("--floor-warmup", type=float, default=3,
        help="floor: seconds after start (the agent: after every target is up) before the window (3)")
    opt("--matrix-only", type=str, metavar="WORD[,WORD]", default=None,
        help="matrix: only the cells whose scenario contains a WORD or whose filesystem is one "
             "(STALLWATCH_MATRIX_ONLY)")
    return ap


def parse(argv=None):
    ap = parser()
    args = ap.parse_args(argv)
    if args.quick:
        for k, v in QUICK.items():
            setattr(args, k, v)
    if not 8 + 1 <= args.scale_targets <= 1000 or not 1 <= args.scale_frozen <= 8:
        ap.error("--scale-targets: 9 to 1000 (8 are loop filesystems); --scale-frozen: 1 to 8")
    names = by_name()
    if args.only is None:
        wanted = {s.name for s in all_sections() if s.default}
    else:
        asked = [n.strip() for n in args.only.split(",") if n.strip()]
        unknown = [n for n in asked if n not in names and n != "all"]
        if unknown:
            ap.error(f"unknown section {', '.join(unknown)}; " + sections_help())
        wanted = ({s.name for s in all_sections()} if "all" in asked
                  else {names[n].name for n in asked})
    args.sections = [s for s in all_sections() if s.name in wanted]
    return args


# ---------------------------------------------------------------------------------------
# Rendering a run


def header(run):
    m = run.machine
    load = " ".join(f"{x:.2f}" for x in m.get("loadavg_before", []))
    return Table(title="stallwatch benchmark", notes=[
        f"commit {run.commit}, {run.date}",
        f"machine: {m['nproc']} CPUs, {m['cpu']}, {m['mem_gib']:.1f} GiB, kernel {m['kernel']}, "
        f"virtualisation: {m['virt']}; load average before: {load}",
        f"loop images: sparse 320 MiB files on {m['loop_images_on']} (buffered loop, no direct I/O)",
        "versions: " + "; ".join(f"{k} {v}" for k, v in run.versions.items()),
        f"binary: {run.binary}",
        f"command: {run.command}"])


def goals_table(goals):
    if not goals:
        return Table(title="Goals", notes=["(none in the selected sections)"])
    return Table(title="Goals", head=("goal", "measured", ""),
                 rows=[(g.goal, g.measured, "ok" if g.ok else "MISSED") for g in goals])


def section_tables(result):
    """A section's tables, from its result as it reads back from JSON."""
    section = by_name()[result.section]
    return section.tables(through_json(result.data), result.params)


def print_text(tables):
    print(render.text(tables), flush=True)


def markdown(run):
    out = [render.markdown([header(run)], heading="###")]
    for r in run.sections:
        out.append(f"\n### {r.section} (commit {run.commit[:7]}, {r.started})\n\n")
        out.append(render.markdown(section_tables(r)))
    out.append("\n" + render.markdown([goals_table(run.goals())], heading="###"))
    return "".join(out)


def show(path, fmt):
    run = Run.from_json(path.read_text())
    if fmt == "md":
        sys.stdout.write(markdown(run))
    else:
        print_text([header(run)] + [t for r in run.sections for t in section_tables(r)]
                   + [goals_table(run.goals())])
    return 0


# ---------------------------------------------------------------------------------------
# A run


def check_setup(args):
    if os.geteuid() != 0:
        raise SetupError("run as root (loop devices, mount, fsfreeze)")
    for tool in TOOLS:
        if not shutil.which(tool):
            raise SetupError(f"{tool} not found")
    if not os.access(args.bin, os.X_OK):
        raise SetupError(f"{args.bin} missing: run cargo build --release first")


def prepare(args):
    """The work directory, a private copy of the binary, and the run's description."""
    work = Path(tempfile.mkdtemp(prefix="stallwatch-bench.", dir="/var/tmp"))
    UNDO.push(f"rm -r {work}", lambda: shutil.rmtree(work, ignore_errors=True))
    # A private copy: the shared target directory may be rebuilt during the run.
    binary = work / "stallwatch"
    shutil.copy2(args.bin, binary)
    run = Run(commit=commit(), date=time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
              machine=machine(work), versions=versions(binary, work),
              binary=binary_identity(args.bin, binary), command=" ".join(sys.argv))
    return Context(args=args, work=work, binary=binary), run


def run_section(ctx, section):
    started = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    t0 = time.monotonic()
    data, goals = section.measure(ctx)
    return SectionResult(section=section.name, params=ctx.params(section), data=data,
                         goals=goals, started=started, seconds=time.monotonic() - t0)


def measure_all(args):
    check_setup(args)
    ctx, run = prepare(args)
    started = time.monotonic()
    print_text([header(run)])
    try:
        for section in args.sections:
            result = run_section(ctx, section)
            run.sections.append(result)
            print_text(section_tables(result))
        run.complete = True
    finally:
        run.wall_seconds = time.monotonic() - started
        if args.json and run.sections:
            args.json.write_text(run.to_json())
    print_text([goals_table(run.goals())])
    print(f"\nwall time of the run: {run.wall_seconds:.0f} s")
    return run


def on_signal(signum, _frame):
    raise KeyboardInterrupt(f"signal {signum}")


def main(argv=None):
    args = parse(argv)
    if args.render:
        return show(args.render, args.format)
    signal.signal(signal.SIGINT, on_signal)  # also when started with SIGINT ignored (nohup, &)
    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGHUP, on_signal)
    try:
        run = measure_all(args)
        return 1 if args.strict and not all(g.ok for g in run.goals()) else 0
    except SetupError as e:
        print(f"setup failed: {e}", file=sys.stderr)
        return 2
    except MeasureError as e:
        print(f"measurement failed: {e}", file=sys.stderr)
        return 1
    except KeyboardInterrupt as e:
        print(f"interrupted ({e}); cleaning up", file=sys.stderr)
        return 130
    finally:
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        UNDO.run_all()
