"""Section `floor`: the agent against the syscall floor (issue 21). The agent with the
scale section's 64 targets (8 loop filesystems and tmpfs mounts) at 1 s with the default
modes, and `bench/floor.c` (compiled here with cc -O2) making the same system calls per
lane cycle on the same directories, one thread per lane as the agent has, back to back
in interleaved rounds (the order alternates). CPU is the run time of the process's
threads over the window, from /proc/PID/task/*/schedstat (nanoseconds); the goal's ratio
is of these. utime+stime of the process is shown beside it: the kernel derives it from
the same run time but reports it in clock ticks (10 ms), about 25 of them per window
here, so one tick moves a round's ratio by ~0.05. Context switches are the voluntary
and involuntary ones summed over the process's threads; the run time per thread name
says where the agent's overhead beyond the floor comes from.
"""

import os
import re
import shutil
import time
from pathlib import Path

from ..harness import (CLK_TCK, Agent, MeasureError, SetupError, log, metric_sum, run, start_proc, stop_proc,
                       target_yaml, wait_all_up)
from ..results import Goal
from ..stats import fixed, med
from ..tables import Table
from . import Section

SOURCE = Path(__file__).resolve().parent.parent / "floor.c"
GOAL = 1.2


def compile_floor(work):
    if not shutil.which("cc"):
        raise SetupError("section floor compiles bench/floor.c: cc not found")
    out = work / "floor"
    run(["cc", "-O2", "-Wall", "-pthread", "-o", str(out), str(SOURCE)], timeout=120)
    return out


def fold(name):
    """Thread names to groups: the lanes (p<i>-<mode> in the agent, f<i>-<mode> in the
    floor program) into lanes-<mode>; trailing digits into #."""
    m = re.match(r"^[pf]\d+-(\w+)", name)
    return f"lanes-{m.group(1)}" if m else re.sub(r"\d+$", "#", name)


def sample(pid):
    """(monotonic s, CPU s of the process, context switches summed over its threads,
    CPU s per thread group from schedstat)."""
    t = time.monotonic()
    f = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    cpu = (int(f[11]) + int(f[12])) / CLK_TCK
    cs, groups = 0, {}
    for task in Path(f"/proc/{pid}/task").iterdir():
        try:
            st = (task / "status").read_text()
            ns = int((task / "schedstat").read_text().split()[0])
        except OSError:
            continue
        cs += sum(int(x) for x in re.findall(r"^(?:non)?voluntary_ctxt_switches:\s+(\d+)", st, re.M))
        name = re.search(r"^Name:\s+(.*)$", st, re.M).group(1)
        g = fold(name)
        groups[g] = groups.get(g, 0) + ns / 1e9
    return t, cpu, cs, groups


def delta(a, b):
    w = b[0] - a[0]
    return {"window": w, "cpu": b[1] - a[1], "cs": b[2] - a[2],
            "threads": {k: v - a[3].get(k, 0) for k, v in b[3].items()}}


def measure_agent(ctx, targets, rnd, binary, tag="agent"):
    cfg = "listen_address: 127.0.0.1:0\ndefaults:\n  interval: 1s\n" + target_yaml(targets)
    agent = Agent(binary, ctx.work, f"floor-{tag}-{rnd}", cfg)
    try:
        wait_all_up(agent, targets, 20)
        time.sleep(ctx.args.floor_warmup)
        text0 = agent.scrape()
        a = sample(agent.pid)
        # Scraped every 15 s, as a Prometheus would; the first scrape is before `a`.
        end = a[0] + ctx.args.floor_window
        nxt = a[0] + 15
        while nxt < end:
            time.sleep(max(0, nxt - time.monotonic()))
            agent.scrape()
            nxt += 15
        time.sleep(max(0, end - time.monotonic()))
        b = sample(agent.pid)
        text1 = agent.scrape()
    finally:
        agent.stop()
    d = delta(a, b)
    d["cycles"] = (metric_sum(text1, "stallwatch_probes_total", targets)
                   - metric_sum(text0, "stallwatch_probes_total", targets))
    return d


def measure_floor(ctx, prog, targets, rnd):
    logf = ctx.work / f"floor-{rnd}.log"
    p = start_proc([str(prog), "-i", "1000", *[str(t.mnt) for t in targets]], logf, "floor")
    try:
        time.sleep(ctx.args.floor_warmup + 1)
        if p.poll() is not None:
            raise MeasureError(f"floor program exited: {logf.read_text()[-1000:]}")
        a = sample(p.pid)
        time.sleep(ctx.args.floor_window)
        b = sample(p.pid)
    finally:
        stop_proc(p)
    out = logf.read_text()
    m = re.search(r"cycles (\d+) errors (\d+)", out)
    if not m or m.group(2) != "0":
        raise MeasureError(f"floor program: {out[-1000:]}")
    d = delta(a, b)
    # Its cycle count covers its whole run; per second of it, over the window.
    d["cycles"] = 2 * len(targets) * d["window"]
    d["cycles_total"] = int(m.group(1))
    return d


def measure(ctx):
    from .scale import scale_targets
    targets = scale_targets(ctx)
    prog = compile_floor(ctx.work)
    whos = ["agent", "floor"]
    before = None
    if ctx.args.floor_compare:
        # Another build of the agent (the one before a change) in the same rounds.
        before = ctx.work / "stallwatch-before"
        shutil.copy2(ctx.args.floor_compare, before)
        whos.append("before")
    rounds = []
    for r in range(ctx.args.floor_rounds):
        # Two: the order alternates; three: it rotates.
        order = (whos[r % 2:] + whos[:r % 2] if len(whos) == 2
                 else whos[r % 3:] + whos[:r % 3])
        res = {"order": list(order), "load": list(os.getloadavg())}
        for who in order:
            log(f"floor: round {r + 1}/{ctx.args.floor_rounds}, {who}, "
                f"{ctx.args.floor_window:.0f} s, {len(targets)} targets at 1 s")
            if who == "floor":
                res[who] = measure_floor(ctx, prog, targets, r)
            else:
                res[who] = measure_agent(ctx, targets, r, before if who == "before" else ctx.binary, who)
        rounds.append(res)
    data = {"targets": len(targets), "lanes": 2 * len(targets), "rounds": rounds,
            "before": str(ctx.args.floor_compare) if before else None}
    return data, goals(data)


def pct_core(x):
    """utime+stime, % of one core."""
    return 100 * x["cpu"] / x["window"]


def run_core(x):
    """Run time summed over the threads (schedstat), % of one core."""
    return 100 * sum(x["threads"].values()) / x["window"]


def cs_s(x):
    return x["cs"] / x["window"]


def cpu_ratios(data, of=run_core, who="agent"):
    """Per round, `who`'s CPU over the floor program's: run time (the goal's), or
    `of=pct_core` for utime+stime."""
    return [of(r[who]) / of(r["floor"]) for r in data["rounds"] if of(r["floor"]) > 0]


def cs_ratios(data):
    return [cs_s(r["agent"]) / cs_s(r["floor"]) for r in data["rounds"] if r["floor"]["cs"] > 0]


def goals(data):
    rs = cpu_ratios(data)
    m = med(rs)
    rng = f"{min(rs):.2f}-{max(rs):.2f}" if rs else "n/a"
    return [Goal(f"CPU <= {GOAL} x the floor program's ({data['targets']} targets, 1 s, "
                 "run time, median of rounds)", f"{fixed(m, 2)} (rounds {rng})", m <= GOAL, m)]


def spread(xs, f):
    return f"{f(med(xs))} ({f(min(xs))}-{f(max(xs))})" if xs else "n/a"


def tables(data, params):
    rows = []
    for i, r in enumerate(data["rounds"]):
        a, f = r["agent"], r["floor"]
        rows.append((i + 1, " then ".join(r["order"]), f"{r['load'][0]:.2f}",
                     f"{run_core(a):.3f} %", f"{run_core(f):.3f} %",
                     fixed(run_core(a) / run_core(f), 2) if run_core(f) else "n/a",
                     fixed(pct_core(a) / pct_core(f), 2) if f["cpu"] else "n/a",
                     f"{cs_s(a):.0f}", f"{cs_s(f):.0f}",
                     fixed(cs_s(a) / cs_s(f), 2) if f["cs"] else "n/a",
                     f"{a['cycles'] / a['window']:.1f}"))
    ag = [run_core(r["agent"]) for r in data["rounds"]]
    fl = [run_core(r["floor"]) for r in data["rounds"]]
    rows.append(("median (range)", "", "", spread(ag, lambda x: f"{x:.3f} %"),
                 spread(fl, lambda x: f"{x:.3f} %"), spread(cpu_ratios(data), lambda x: f"{x:.2f}"),
                 spread(cpu_ratios(data, pct_core), lambda x: f"{x:.2f}"),
                 spread([cs_s(r["agent"]) for r in data["rounds"]], lambda x: f"{x:.0f}"),
                 spread([cs_s(r["floor"]) for r in data["rounds"]], lambda x: f"{x:.0f}"),
                 spread(cs_ratios(data), lambda x: f"{x:.2f}"), ""))
    notes = []
    if data.get("before"):
        bf = [run_core(r["before"]) for r in data["rounds"]]
        br = cpu_ratios(data, who="before")
        ba = [run_core(r["agent"]) / run_core(r["before"]) for r in data["rounds"]
              if run_core(r["before"])]
        bl = [sum(v for k, v in r["before"]["threads"].items() if k.startswith("lanes-"))
              / max(1, r["before"]["cycles"]) for r in data["rounds"]]
        notes.append(f"before ({data['before']}), in the same rounds: CPU "
                     + spread(bf, lambda x: f"{x:.3f} %") + ", ratio to the floor "
                     + spread(br, lambda x: f"{x:.2f}") + " (utime+stime "
                     + spread(cpu_ratios(data, pct_core, "before"), lambda x: f"{x:.2f}")
                     + "), agent/before "
                     + spread(ba, lambda x: f"{x:.2f}") + ", context switches "
                     + spread([cs_s(r["before"]) for r in data["rounds"]], lambda x: f"{x:.0f}")
                     + "/s, lanes per cycle " + spread(bl, lambda x: f"{x * 1e6:.1f} µs"))
    main = Table(
        title="Agent against the syscall floor",
        caption=f"{data['targets']} targets (8 loop filesystems, the rest tmpfs), default modes "
                f"(create, overwrite 4 KiB + fsync) at 1 s: {data['lanes']} lanes; the agent "
                "(scraped every 15 s) and bench/floor.c (the same system calls per lane "
                f"cycle, one thread per lane) back to back, {params['floor_window']:g} s each, "
                "the order alternating by round; CPU is the run time of all the process's "
                "threads over the window (schedstat, ns), the ratio of utime+stime (10 ms "
                "ticks) beside it; context switches voluntary + involuntary of all its threads",
        head=("round", "order", "load (1 min)", "agent CPU", "floor CPU", "ratio",
              "utime+stime ratio", "agent cs/s", "floor cs/s", "cs ratio", "agent cycles/s"),
        rows=rows, notes=notes)
    # Where the agent's CPU goes: per thread group, median over the rounds.
    groups = sorted({g for r in data["rounds"] for g in r["agent"]["threads"]},
                    key=lambda g: -med([r["agent"]["threads"].get(g, 0) for r in data["rounds"]]))
    floor_lanes = med([sum(v for k, v in r["floor"]["threads"].items() if k.startswith("lanes-"))
                       / r["floor"]["window"] for r in data["rounds"]])
    brows = []
    for g in groups:
        v = [r["agent"]["threads"].get(g, 0) / r["agent"]["window"] for r in data["rounds"]]
        brows.append((g, f"{100 * med(v):.3f} %", f"{100 * min(v):.3f}-{100 * max(v):.3f} %"))
    fgroups = sorted({g for r in data["rounds"] for g in r["floor"]["threads"]})
    for g in fgroups:
        v = [r["floor"]["threads"].get(g, 0) / r["floor"]["window"] for r in data["rounds"]]
        brows.append((f"floor: {g}", f"{100 * med(v):.3f} %", f"{100 * min(v):.3f}-{100 * max(v):.3f} %"))
    agent_lanes = med([sum(v for k, v in r["agent"]["threads"].items() if k.startswith("lanes-"))
                       / r["agent"]["window"] for r in data["rounds"]])
    per_cycle = med([sum(v for k, v in r["agent"]["threads"].items() if k.startswith("lanes-"))
                     / max(1, r["agent"]["cycles"]) for r in data["rounds"]])
    fper_cycle = med([sum(v for k, v in r["floor"]["threads"].items() if k.startswith("lanes-"))
                      / max(1, r["floor"]["cycles"]) for r in data["rounds"]])
    breakdown = Table(
        title="Where the agent's CPU goes",
        caption="CPU per thread group (schedstat run time), % of one core, median and range "
                "over the rounds",
        head=("thread group", "median", "range"), rows=brows,
        notes=[f"lanes alone: agent {100 * agent_lanes:.3f} %, floor {100 * floor_lanes:.3f} % "
               f"(ratio {fixed(agent_lanes / floor_lanes if floor_lanes else None, 2)}); "
               f"per lane cycle {per_cycle * 1e6:.1f} µs against {fper_cycle * 1e6:.1f} µs"])
    return [main, breakdown]


SECTION = Section(
    name="floor", aliases=(),
    summary="64 targets at 1 s: the agent's CPU and context switches against bench/floor.c, "
            "the same system calls per lane cycle (only when named)",
    params=("scale_targets", "floor_rounds", "floor_window", "floor_warmup", "floor_compare"),
    default=False, measure=measure, tables=tables)
