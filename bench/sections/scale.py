"""Section `scale` (6): cost at 64 targets, the 8 loop filesystems and tmpfs mounts,
against node_exporter: CPU and RSS at a 1 s and a 10 s interval (6), the scrape cost at
1 s (6b), and the scrape cost while some loop targets are frozen (6c): a scrape must
never wait on a lane. Then the scrape cost by format (6d), text 0.0.4, OpenMetrics and
protobuf, plain and gzip, with the 64 targets and with the 8 loop filesystems alone
(the set of section `overhead`), each its own agent at 1 s."""

import json
import re
import time

from .. import scrapecost
from ..harness import (Agent, MeasureError, NodeExporter, Tmpfs, get_timed, lane_cpu, log,
                       freezer, metric_sum, metric_values, proc_stat, samples,
                       scrape_every_15s, stop_proc, target_yaml, thaw, thread_cpu,
                       thread_seconds, usage, wait_all_up)
from ..results import Goal
from ..stats import fixed, ms, pct, ratio, us
from ..tables import Table
from . import Section


# ---------------------------------------------------------------------------------------
# While frozen (6c)


def wait_blocked(agent, names):
    """Until every lane of each frozen target is seen in flight past 1 s. Every lane of
    a frozen target enters its next cycle within one interval and blocks in its first
    write-side call."""
    t0 = time.monotonic()
    while True:
        text = agent.scrape()
        blocked = {n: len([v for v in metric_values(text, "stallwatch_probe_inflight_seconds", n)
                           if v >= 1.0]) for n in names}
        if all(b >= 2 for b in blocked.values()):
            return
        if time.monotonic() - t0 > 10:
            raise MeasureError(f"frozen targets' lanes not all blocked after 10 s: {blocked}")
        time.sleep(0.1)


def while_blocked(ctx, agent, ne, names, t0):
    """The scrape blocks, the page and /api/stalls, timed with the lanes blocked."""
    res = scrapecost.blocks({"sw": f"http://{agent.addr}/metrics",
                             "ne": f"http://{ne.addr}/metrics"}, ctx.args.frozen_requests)
    res["page"] = get_timed(agent.client, "/", 50)
    res["api"] = get_timed(agent.client, "/api/stalls", 50)
    text = agent.scrape()
    ages = [v for n in names for v in metric_values(text, "stallwatch_probe_inflight_seconds", n)
            if v > 0]
    res["blocked_lanes"] = len(ages)
    res["age_min"], res["age_max"] = min(ages), max(ages)
    res["held"] = time.monotonic() - t0
    res["names"] = sorted(names)
    page = agent.client.get("/")[0].decode()
    res["page_lists"] = sum(1 for n in names for m in ("create", "overwrite")
                            if re.search(rf"<td>{n}</td>(?:(?!</tr>).)*?{m} \w+ for", page))
    stalls_now = json.loads(agent.client.get("/api/stalls")[0])
    res["ongoing"] = len([e for e in stalls_now if e["ongoing"] and e["target"] in names])
    return res


def events_after_thaw(agent, names):
    """The frozen targets' events once every one is closed (or after 10 s)."""
    deadline = time.monotonic() + 10
    while True:
        ev = json.loads(agent.client.get("/api/stalls")[0])
        mine = [e for e in ev if e["target"] in names]
        if mine and not any(e["ongoing"] for e in mine):
            return mine
        if time.monotonic() > deadline:
            return mine
        time.sleep(0.2)


def scrape_while_frozen(ctx, agent, ne, frozen):
    """Freezes `frozen` (loop targets), waits until every lane of each is blocked past
    the stall threshold, then times scrapes of both servers, the landing page and
    /api/stalls; thaws in a finally."""
    hold = 60  # the children's own thaw, should the runner die; we thaw well before
    fzs = []
    names = {f.name for f in frozen}
    try:
        for f in frozen:
            fzs.append(freezer(f.mnt, hold))
        t0 = time.monotonic()
        wait_blocked(agent, names)
        log(f"frozen {sorted(names)}: every lane blocked after {time.monotonic() - t0:.1f} s; "
            f"scrape cost while frozen, {ctx.args.frozen_requests} requests per server and encoding")
        res = while_blocked(ctx, agent, ne, names, t0)
    finally:
        for f in frozen:
            thaw(f.mnt)
        for fz in fzs:
            stop_proc(fz)
    # After the thaw: every lane's blocked call returns and its stall is closed.
    mine = events_after_thaw(agent, names)
    res["events"] = len(mine)
    res["events_naming_other"] = len([e for e in mine if e["also_blocked"]])
    return res


# ---------------------------------------------------------------------------------------
# One interval


def window(ctx, agent, ne, targets, iv):
    """CPU, memory, cycles and series of the agent over the scale window."""
    time.sleep(2)
    a0, n0, th0 = proc_stat(agent.pid), proc_stat(ne.pid), thread_cpu(agent.pid)
    log(f"scale {iv}: window {ctx.args.scale_window:.0f} s, agent {agent.addr}, node_exporter "
        f"{ne.addr}, both scraped every 15 s")
    el, scrapes, text0 = scrape_every_15s(agent, ne, ctx.args.scale_window)
    a1, n1, th1 = proc_stat(agent.pid), proc_stat(ne.pid), thread_cpu(agent.pid)
    text1 = agent.scrape()
    lines = samples(text1)
    per_target = [len([ln for ln in lines if f'target="{t.name}"' in ln]) for t in targets]
    return {
        "window": el, "scrapes": scrapes,
        "cycles": (metric_sum(text1, "stallwatch_probes_total", targets)
                   - metric_sum(text0, "stallwatch_probes_total", targets)),
        "skipped": (metric_sum(text1, "stallwatch_probes_skipped_total", targets)
                    - metric_sum(text0, "stallwatch_probes_skipped_total", targets)),
        "errors": [ln for ln in lines if ln.startswith("stallwatch_probe_errors_total")],
        "up": sum(metric_values(text1, "stallwatch_target_up", t.name)[0] for t in targets),
        "targets": len(targets), "lanes": len(targets) * 2,
        "sw": usage(a0, a1), "ne": usage(n0, n1), "threads": thread_seconds(th0, th1),
        "series": len(lines), "per_target": [min(per_target), max(per_target)],
        "bytes": len(text1.encode()),
    }


def scale_phase(ctx, targets, loops, interval, with_scrape):
    """One agent probing every target at `interval`, next to node_exporter, for the
    scale window; then (with_scrape) the scrape cost and the scrape cost while
    --scale-frozen of the loop targets are frozen."""
    iv = f"{interval:g}s"
    cfg = f"listen_address: 127.0.0.1:0\ndefaults:\n  interval: {iv}\n" + target_yaml(targets)
    agent = Agent(ctx.binary, ctx.work, f"agent{len(targets)}-{iv}", cfg)
    ne = NodeExporter(ctx.work, f"scale-{iv}")
    t_up = time.monotonic()
    # Lanes start staggered over the interval: every target is up after one interval.
    wait_all_up(agent, targets, 2 * interval + 15)
    log(f"scale {iv}: {len(targets)} targets up after {time.monotonic() - t_up:.1f} s")
    out = {"interval": interval, **window(ctx, agent, ne, targets, iv)}
    if with_scrape:
        log(f"scale {iv}: scrape cost, {ctx.args.requests} requests per server and encoding")
        out["scrape"] = scrapecost.with_cpu(agent, ne, ctx.args.requests)
        out["formats"] = formats(ctx, agent, len(targets))
        out["frozen"] = scrape_while_frozen(ctx, agent, ne, loops[:ctx.args.scale_frozen])
        out["sw"]["hwm_end"] = proc_stat(agent.pid)[2]
    agent.stop()
    ne.stop()
    return out


def formats(ctx, agent, n):
    """6d of one agent: its scrape cost by format (scrapecost.by_format)."""
    log(f"scale: scrape cost by format, {n} targets, {ctx.args.format_requests} requests per "
        "format and encoding")
    return scrapecost.by_format(agent, ctx.args.format_requests)


def formats_loops(ctx, loops):
    """6d with the 8 loop filesystems alone: an agent of its own at 1 s, measured once
    every target is up and 2 s more (as the window of the 64)."""
    cfg = "listen_address: 127.0.0.1:0\ndefaults:\n  interval: 1s\n" + target_yaml(loops)
    agent = Agent(ctx.binary, ctx.work, f"agent{len(loops)}-formats", cfg)
    try:
        wait_all_up(agent, loops, 2 + 15)
        time.sleep(2)
        return formats(ctx, agent, len(loops))
    finally:
        agent.stop()


# ---------------------------------------------------------------------------------------


def goals(data):
    one, ten = data["1s"], data["10s"]
    n = one["targets"]
    c = 100 * one["sw"]["cpu"] / one["window"]
    hwm = max(one["sw"]["hwm"], one["sw"]["hwm_end"], ten["sw"]["hwm"])
    g = [Goal(f"CPU <= 1% of one core ({n} targets, 1 s)", f"{c:.3f} %", c <= 1.0, c),
         Goal(f"peak RSS <= 24 MiB ({n} targets, all phases)", f"{hwm / 1024:.1f} MiB",
              hwm <= 24 * 1024, hwm / 1024)]
    for key, lab in (("scrape", ""), ("frozen", f", {len(one['frozen']['names'])} frozen")):
        for sw, ne, glab in (("sw", "ne", ""), ("sw_gzip", "ne_gzip", " gzip")):
            p, q = one[key][sw]["p99"], one[key][ne]["p99"]
            g.append(Goal(f"scrape p99 <= 5 ms ({n} targets{lab}{glab})", ms(p), p <= 0.005, p))
            g.append(Goal(f"scrape p99 < node_exporter's ({n} targets{lab}{glab})",
                          fixed(ratio(p, q)), p < q, ratio(p, q)))
    # 6d: the formats Prometheus asks for by default (OpenMetrics) and with native
    # histograms (protobuf); text is 6b's.
    for key, lab in (("om", "OpenMetrics"), ("pb", "protobuf")):
        for k, glab in ((key, ""), (f"{key}_gzip", " gzip")):
            p = one["formats"][k]["p99"]
            g.append(Goal(f"scrape p99 <= 5 ms ({n} targets, {lab}{glab})", ms(p), p <= 0.005, p))
    return g


def scale_targets(ctx):
    """The 8 loop filesystems and --scale-targets - 8 tmpfs mounts (made on first use,
    shared with section `floor`)."""
    loops = ctx.loops()
    if ctx.tmpfs is None:
        n_tmpfs = ctx.args.scale_targets - len(loops)
        log(f"mounting {n_tmpfs} tmpfs under {ctx.work / 'tmpfs'}")
        ctx.tmpfs = [Tmpfs(ctx.work, i).create() for i in range(n_tmpfs)]
    return loops + ctx.tmpfs


def measure(ctx):
    loops = ctx.loops()
    targets = scale_targets(ctx)
    n_tmpfs = len(targets) - len(loops)
    data = {"n_tmpfs": n_tmpfs, "n_loop": len(loops),
            "1s": scale_phase(ctx, targets, loops, 1.0, with_scrape=True),
            "formats_loops": formats_loops(ctx, loops),
            "10s": scale_phase(ctx, targets, loops, 10.0, with_scrape=False)}
    return data, goals(data)


def cost_table(data):
    one, ten = data["1s"], data["10s"]
    rows = []
    for ph in (one, ten):
        for k, name in (("sw", "stallwatch"), ("ne", "node_exporter")):
            o = ph[k]
            rows.append((f"{ph['interval']:g} s", name, f"{ph['window']:.0f} s", f"{o['cpu']:.2f} s",
                         f"{100 * o['cpu'] / ph['window']:.3f} %", f"{o['hwm'] / 1024:.1f} MiB",
                         f"{o['rss'] / 1024:.1f} MiB", o["threads"]))
    notes = []
    for ph in (one, ten):
        lanes_s = lane_cpu(ph["threads"])
        others = sorted(((k, v) for k, v in ph["threads"].items() if not k.startswith("lanes-")),
                        key=lambda x: -x[1])
        notes.append(f"{ph['interval']:g} s: {ph['cycles']:.0f} lane cycles in the window "
                     f"({ph['cycles'] / ph['window']:.1f}/s), {ph['skipped']:.0f} skipped, "
                     f"{ph['up']:.0f}/{ph['targets']} targets up, {len(ph['errors'])} error series; "
                     f"stallwatch CPU by thread: lanes {lanes_s * 1e3:.0f} ms "
                     f"({us(lanes_s / max(1, ph['cycles']))} per lane cycle), "
                     + ", ".join(f"{k} {v * 1e3:.0f} ms" for k, v in others))
    notes.append(f"series: {one['series']} sample lines in a scrape with {one['targets']} targets "
                 f"({one['per_target'][0]}-{one['per_target'][1]} per target), {one['bytes']} bytes plain")
    return Table(
        title="6. Cost at scale",
        caption=f"{one['targets']} targets ({data['n_loop']} loop filesystems, 4 XFS + 4 ext4, "
                f"and {data['n_tmpfs']} tmpfs of 8 MiB), default modes (create, overwrite+fsync): "
                f"{one['lanes']} lanes; next to node_exporter (default collectors, same host, same "
                "mounts), both scraped every 15 s; CPU is utime+stime of the process over the window",
        head=("interval", "process", "window", "CPU", "of one core", "peak RSS (VmHWM)",
              "RSS at end", "threads"),
        rows=rows, notes=notes)


def frozen_table(one, params):
    fr, sc = one["frozen"], one["scrape"]
    rows = [(name, ms(fr[key]["p50"]), ms(fr[key]["p99"]), ms(fr[key]["max"]),
             ms(sc[key]["p99"]), fixed(ratio(fr[key]["p99"], sc[key]["p99"])))
            for key, name in ((r.key, r.name) for r in scrapecost.ROWS)]
    n = len(fr["names"])
    return Table(
        title="6c. Scrape cost while frozen",
        caption=f"{n} of the {one['targets']} targets frozen ({', '.join(fr['names'])}: "
                f"fsfreeze -f, every lane of each blocked past 1 s before the first request; "
                f"{fr['blocked_lanes']} lanes in flight at the end, blocked "
                f"{fr['age_min']:.1f}-{fr['age_max']:.1f} s), {params['frozen_requests']} "
                "requests per row in blocks of 25",
        head=("server", "p50 frozen", "p99 frozen", "max frozen", "p99 not frozen (6b)",
              "frozen/not"),
        rows=rows,
        notes=[f"landing page (50 GETs while frozen): p50 {ms(pct(fr['page'], 50))}, max "
               f"{ms(max(fr['page']))}, lists {fr['page_lists']} of {2 * n} blocked lanes; "
               f"/api/stalls: p50 {ms(pct(fr['api'], 50))}, max {ms(max(fr['api']))}, "
               f"{fr['ongoing']} ongoing events; after the thaw {fr['events']} events of the "
               f"frozen targets, {fr['events_naming_other']} naming another lane blocked with it"])


def tables(data, params):
    one = data["1s"]
    return [cost_table(data),
            scrapecost.table(f"6b. Scrape cost with {one['targets']} targets at 1 s",
                             f"GET /metrics, {params['requests']} keep-alive requests per row, "
                             "rows alternating in blocks of 25 (as in 3)", one["scrape"]),
            frozen_table(one, params),
            scrapecost.format_table(
                "6d. Scrape cost by format",
                f"GET /metrics of an agent at 1 s with the {one['targets']} targets (6b's) and "
                f"of one with the {data['n_loop']} loop filesystems alone (section 3's set), "
                f"{params['format_requests']} keep-alive requests per row, the six rows and an "
                "idle block rotating in blocks of 25; Accept: text/plain;version=0.0.4, and "
                "Prometheus 2.42's headers for OpenMetrics and for protobuf (native "
                "histograms on); every response's Content-Type checked, one body per row "
                "read back by its bytes; CPU/scrape: the agent's CPU (its threads' schedstat) "
                "over the row's blocks less the idle background, per request; ratios to text of the same "
                "encoding and target count",
                {one["targets"]: one["formats"], data["n_loop"]: data["formats_loops"]})]


SECTION = Section(
    name="scale", aliases=("6",),
    summary="64 targets (tmpfs + loop) beside node_exporter at 1 s and 10 s; scrape cost, "
            "also while targets are frozen, and by format (only when named)",
    params=("scale_targets", "scale_window", "scale_frozen", "requests", "frozen_requests",
            "format_requests"),
    default=False, measure=measure, tables=tables)
