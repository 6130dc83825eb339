"""Section `agent`: the agent's own figures on one machine, as scripts/measure-agent.sh
took them before it moved here: CPU time and peak RSS with 4 directory targets at a 1 s
interval over a window (60 s) with a scrape every 15 s; then the median and slowest
/metrics response (a new connection each, as curl makes it) while one target's XFS
loop filesystem is frozen (5 s), and the in-flight age reached by then.
"""

import time

from ..harness import (Agent, Fs, MeasureError, freezer, log, metric_values, proc_stat, run, stop_proc,
                       thaw, usage)
from ..stats import med, ms
from ..tables import Table
from . import Section


def directories(work, n):
    dirs = [work / f"dir{i}" for i in range(1, n + 1)]
    for d in dirs:
        d.mkdir(exist_ok=True)
    return dirs


def idle_cost(ctx):
    """4 directory targets at 1 s: CPU and peak RSS over the window."""
    cfg = "targets:\n" + "".join(f"  - path: {d}\n    require_mountpoint: false\n    interval: 1s\n"
                                 for d in directories(ctx.work, 4))
    agent = Agent(ctx.binary, ctx.work, "agent-dirs", cfg)
    time.sleep(2)
    a0, t0 = proc_stat(agent.pid), time.monotonic()
    for _ in range(int(ctx.args.agent_window // 15)):
        time.sleep(15)
        agent.scrape()
    a1, wall = proc_stat(agent.pid), time.monotonic() - t0
    agent.stop()
    return {"targets": 4, "window": wall, **usage(a0, a1)}


def curl_time(url):
    """Seconds of one GET on a new connection, as curl's time_total."""
    return float(run(["curl", "-s", "-o", "/dev/null", "-w", "%{time_total}", url]).stdout)


def scrapes_while_frozen(ctx):
    """A target on an XFS loop filesystem and one directory at 500 ms; /metrics every
    50 ms while the filesystem is frozen."""
    fs = Fs(ctx.work, "xfs", 0, name="frozen").create()
    other = directories(ctx.work, 1)[0]
    cfg = (f"targets:\n  - path: {fs.mnt}\n    name: frozen\n    interval: 500ms\n"
           f"  - path: {other}\n    require_mountpoint: false\n    interval: 500ms\n")
    agent = Agent(ctx.binary, ctx.work, "agent-frozen", cfg)
    url = f"http://{agent.addr}/metrics"
    time.sleep(2)
    hold = ctx.args.agent_freeze
    fz = freezer(fs.mnt, hold + 60)  # thaws by itself should the runner die
    times = []
    try:
        if fz.stdout.readline().strip() != "frozen":  # fsfreeze -f has returned
            raise MeasureError(f"fsfreeze -f {fs.mnt} failed")
        end = time.monotonic() + hold
        while time.monotonic() < end:
            times.append(curl_time(url))
            time.sleep(0.05)
        inflight = max(metric_values(agent.scrape(), "stallwatch_probe_inflight_seconds", "frozen"))
    finally:
        thaw(fs.mnt)
        stop_proc(fz)
    agent.stop()
    return {"hold": hold, "n": len(times), "median": med(times), "max": max(times),
            "inflight": inflight}


def measure(ctx):
    log(f"agent: 4 directory targets at 1 s for {ctx.args.agent_window:.0f} s")
    data = {"idle": idle_cost(ctx)}
    log(f"agent: scrapes during a {ctx.args.agent_freeze:g} s freeze of one target")
    data["frozen"] = scrapes_while_frozen(ctx)
    return data, []


def tables(data, params):
    i, f = data["idle"], data["frozen"]
    return [Table(
        title="Agent",
        caption=f"{i['targets']} directory targets at a 1 s interval, scraped every 15 s; then "
                f"/metrics every 50 ms (a new connection each) during a {f['hold']:g} s freeze "
                "of one target's XFS loop filesystem",
        head=("what", "measured"),
        rows=[("window", f"{i['window']:.1f} s"),
              ("CPU (utime+stime)", f"{i['cpu']:.2f} s ({100 * i['cpu'] / i['window']:.3f}% of one core)"),
              ("peak RSS (VmHWM)", f"{i['hwm'] / 1024:.1f} MiB"),
              ("scrapes during the freeze", f"{f['n']}, median {ms(f['median'])}, slowest {ms(f['max'])}"),
              ("in-flight age at the end of the freeze", f"{f['inflight']:.2f} s")])]


SECTION = Section(
    name="agent", aliases=(),
    summary="the agent alone: 4 directory targets' CPU and RSS, scrapes during a freeze "
            "(was scripts/measure-agent.sh; only when named)",
    params=("agent_window", "agent_freeze"), default=False, measure=measure, tables=tables)
