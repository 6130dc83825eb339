"""Section `detection` (4): how soon a freeze shows. One XFS loop target at a 200 ms
interval with a 1 s threshold, ioping beside it; `fsfreeze -f` held 2 s at a random
phase, /metrics polled every 20 ms; times from the start of the freeze to the first
poll that shows the call in flight, and the stall counted."""

import json
import random
import subprocess
import time

from ..harness import (UNDO, Agent, LineReader, freezer, log, metric_values, stop_proc,
                       target_yaml, thaw)
from ..results import Goal
from ..stats import med, missing, ms
from ..tables import Table
from . import Section

THRESHOLD, INTERVAL, HOLD = 1.0, 0.2, 2.0


def start_ioping(fs):
    """ioping beside the agent, as an operator would run it: one request every 200 ms."""
    io = subprocess.Popen(["stdbuf", "-oL", "ioping", "-W", "-s", "4k", "-S", "4k", "-i", "200ms",
                           "-w", "60s", str(fs.mnt / "ioping")], stdout=subprocess.PIPE,
                          stderr=subprocess.DEVNULL, text=True, start_new_session=True)
    UNDO.push(f"stop ioping (pid {io.pid})", lambda: stop_proc(io))
    reader = LineReader(io.stdout)
    reader.start()
    return io, reader


def poll_until_seen(agent, fs, t0, base):
    """Polls /metrics every 20 ms until the freeze shows as in flight and as a stall,
    or the hold ends: (s to in-flight, s to stall, in-flight age first seen, polls)."""
    t_inflight = t_stall = age_seen = None
    polls = 0
    while time.monotonic() - t0 < HOLD - 0.1 and (t_inflight is None or t_stall is None):
        tp = time.monotonic()
        text = agent.scrape()
        tr = time.monotonic()
        polls += 1
        infl = max(metric_values(text, "stallwatch_probe_inflight_seconds", fs.name))
        if t_inflight is None and infl > 0:
            t_inflight, age_seen = tr - t0, infl
        if t_stall is None and sum(metric_values(text, "stallwatch_stalls_total", fs.name)) > base:
            t_stall = tr - t0
        time.sleep(max(0, 0.02 - (time.monotonic() - tp)))
    return t_inflight, t_stall, age_seen, polls


def trial(agent, fs):
    """One freeze: its timings, and t0 (monotonic) to place ioping's lines."""
    time.sleep(0.5 + random.uniform(0, INTERVAL))
    text = agent.scrape()
    base = sum(metric_values(text, "stallwatch_stalls_total", fs.name))
    if max(metric_values(text, "stallwatch_probe_inflight_seconds", fs.name)) > 0.1:
        log("note: a probe op was already slow before the freeze")
    t0 = time.monotonic()
    fz = freezer(fs.mnt, HOLD)  # the child thaws by itself too, even if we die
    fzr = LineReader(fz.stdout)
    fzr.start()
    t_inflight, t_stall, age_seen, polls = poll_until_seen(agent, fs, t0, base)
    try:
        fz.wait(HOLD + 30)
    finally:
        thaw(fs.mnt)
    fzr.join(2)
    nan = float("nan")
    t_frozen = next((t - t0 for t, ln in fzr.lines if ln == "frozen"), nan)
    t_thawed = next((t - t0 for t, ln in fzr.lines if ln == "thawed"), nan)
    time.sleep(0.5)
    return {"inflight": t_inflight, "stall": t_stall, "age": age_seen,
            "frozen": t_frozen, "thawed": t_thawed, "polls": polls, "t0": t0}


def first_ioping_line(lines, t0):
    """ioping's first line after a freeze began; lines arriving in the first 0.3 s
    belong to requests issued before the freeze."""
    after = [(t - t0, ln) for t, ln in lines if t >= t0 + 0.3 and "request=" in ln]
    return after[0] if after else None


def goals(data):
    g = []
    lim = data["threshold"] + 0.3
    for key, lab in (("inflight", "in-flight age visible"), ("stall", "stall counted")):
        worst = max((t[key] if t[key] is not None else float("inf")) for t in data["trials"])
        g.append(Goal(f"{lab} within threshold+0.3 s (worst of {len(data['trials'])})",
                      ms(worst) if worst != float("inf") else "never", worst <= lim,
                      worst if worst != float("inf") else None))
    return g


def measure(ctx):
    fs = ctx.loops()[0]
    cfg = (f"listen_address: 127.0.0.1:0\nstall_threshold: {THRESHOLD:g}s\ndefaults:\n"
           f"  interval: {int(INTERVAL * 1000)}ms\n" + target_yaml([fs]))
    agent = Agent(ctx.binary, ctx.work, "agent-freeze", cfg)
    io, ioping_lines = start_ioping(fs)
    time.sleep(1.5)
    trials = []
    for k in range(ctx.args.freezes):
        trials.append(trial(agent, fs))
        log(f"freeze {k + 1}/{ctx.args.freezes}: in-flight at {trials[-1]['inflight']}, "
            f"stall at {trials[-1]['stall']}")
    time.sleep(0.5)
    stall_events = json.loads(agent.client.get("/api/stalls")[0])
    agent.stop()
    stop_proc(io)
    for tr in trials:
        tr["ioping"] = first_ioping_line(ioping_lines.lines, tr.pop("t0"))
    data = {"threshold": THRESHOLD, "interval": INTERVAL, "hold": HOLD, "trials": trials,
            "events": len(stall_events)}
    return data, goals(data)


def when(t):
    return "never" if t is None else ms(t)


def tables(data, params):
    rows = []
    for i, t in enumerate(data["trials"], 1):
        io = t["ioping"]
        iot = f"+{io[0]:.2f} s: {io[1].split(': ', 1)[-1]}" if io else "none"
        rows.append((i, ms(t["frozen"]), when(t["inflight"]), when(t["stall"]),
                     ms(t["thawed"]), iot))
    nan = float("nan")
    medians = {k: med([t[k] if not missing(t[k]) else nan for t in data["trials"]])
               for k in ("inflight", "stall")}
    return [Table(
        title="4. Detection delay",
        caption=f"fsfreeze -f of an XFS loop target for {data['hold']:g} s, threshold "
                f"{data['threshold']:g} s, interval {data['interval'] * 1000:.0f} ms, /metrics "
                "polled every 20 ms; times from the start of fsfreeze (reply time of the first "
                "poll that shows it)",
        head=("freeze", "fs frozen", "in-flight > 0", "stall counted", "thawed",
              "ioping's first line after the freeze"),
        rows=rows,
        notes=[f"median: in-flight {ms(medians['inflight'])}, stall counted "
               f"{ms(medians['stall'])}; /api/stalls events: {data['events']}"])]


SECTION = Section(
    name="detection", aliases=("4",),
    summary="fsfreeze of an XFS target: time until in flight and until a stall is counted",
    params=("freezes",), default=True, measure=measure, tables=tables)
