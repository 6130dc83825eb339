"""Section `overhead` (2 and 3; also named `scrape`): the agent with the 8 loop targets
at a 1 s interval beside node_exporter for a window, both scraped every 15 s, their CPU
and RSS (2); then the cost of a scrape of each, plain and gzip (3). One run measures both.
"""

import time

from .. import scrapecost
from ..harness import (Agent, NodeExporter, lane_cpu, log, metric_sum, metric_values,
                       proc_stat, samples, scrape_every_15s, target_yaml, thread_cpu,
                       thread_seconds, usage)
from ..results import Goal
from ..stats import fixed, ms, ratio, us
from ..tables import Table
from . import Section


def overhead(ctx, agent, ne, fss):
    """CPU and memory of both processes over the window, by thread for the agent."""
    time.sleep(2)  # both past start-up: first probe cycles done, collectors initialised
    a0, n0, th0 = proc_stat(agent.pid), proc_stat(ne.pid), thread_cpu(agent.pid)
    log(f"overhead window: {ctx.args.window:.0f} s, agent {agent.addr} and node_exporter "
        f"{ne.addr} scraped every 15 s")
    el, scrapes, text0 = scrape_every_15s(agent, ne, ctx.args.window)
    a1, n1, th1 = proc_stat(agent.pid), proc_stat(ne.pid), thread_cpu(agent.pid)
    text8 = agent.scrape()
    return {
        "window": el, "scrapes": scrapes,
        "cycles": (metric_sum(text8, "stallwatch_probes_total", fss)
                   - metric_sum(text0, "stallwatch_probes_total", fss)),
        "errors": [ln for ln in samples(text8) if ln.startswith("stallwatch_probe_errors_total")],
        "up": sum(metric_values(text8, "stallwatch_target_up", f.name)[0] for f in fss),
        "sw": usage(a0, a1), "ne": usage(n0, n1), "threads": thread_seconds(th0, th1),
        "series8": len(samples(text8)),
    }


def goals(data):
    over, sc = data["overhead"], data["scrape"]
    c = 100 * over["sw"]["cpu"] / over["window"]
    g = [Goal("CPU <= 0.2% of one core (8 targets, 1 s)", f"{c:.3f} %", c <= 0.2, c),
         Goal("peak RSS <= 10 MiB", f"{over['sw']['hwm'] / 1024:.1f} MiB",
              over["sw"]["hwm"] <= 10 * 1024, over["sw"]["hwm"] / 1024)]
    for sw, ne, lab in (("sw", "ne", ""), ("sw_gzip", "ne_gzip", " (gzip)")):
        p = sc[sw]["p99"]
        g.append(Goal(f"scrape p99 < 2 ms{lab}", ms(p), p < 0.002, p))
        rt = ratio(p, sc[ne]["p99"])
        g.append(Goal(f"scrape p99 < 1/5 of node_exporter's{lab}", fixed(rt), rt < 0.2, rt))
    return g


def measure(ctx):
    fss = ctx.loops()
    cfg = "listen_address: 127.0.0.1:0\ndefaults:\n  interval: 1s\n" + target_yaml(fss)
    agent = Agent(ctx.binary, ctx.work, "agent8", cfg)
    ne = NodeExporter(ctx.work, "overhead")
    data = {"overhead": overhead(ctx, agent, ne, fss)}
    log(f"scrape cost: {ctx.args.requests} keep-alive requests per server and encoding, "
        "interleaved in blocks of 25")
    data["scrape"] = scrapecost.with_cpu(agent, ne, ctx.args.requests)
    agent.stop()
    ne.stop()
    return data, goals(data)


def overhead_table(over):
    win = over["window"]
    rows = [(name, f"{o['cpu']:.2f} s", f"{100 * o['cpu'] / win:.3f} %",
             f"{o['hwm'] / 1024:.1f} MiB", f"{o['rss'] / 1024:.1f} MiB", o["threads"])
            for name, o in (("stallwatch", over["sw"]), ("node_exporter", over["ne"]))]
    threads = sorted(over["threads"].items(), key=lambda x: -x[1])
    return Table(
        title="2. Overhead",
        caption=f"over {win:.0f} s, both running concurrently, each scraped every 15 s "
                f"({over['scrapes']} scrapes); agent: 8 loop targets (4 XFS, 4 ext4), "
                f"interval 1 s, default modes (create, overwrite+fsync); {over['cycles']:.0f} "
                f"mode cycles in the window, {over['up']:.0f}/8 targets up, "
                f"{len(over['errors'])} error series",
        head=("process", "CPU (utime+stime)", "of one core", "peak RSS (VmHWM)", "RSS at end",
              "threads"),
        rows=rows,
        notes=[f"ratio stallwatch/node_exporter: CPU {fixed(ratio(over['sw']['cpu'], over['ne']['cpu']))}, "
               f"peak RSS {fixed(ratio(over['sw']['hwm'], over['ne']['hwm']))}",
               "stallwatch CPU by thread (schedstat): "
               + ", ".join(f"{k} {v * 1e3:.0f} ms" for k, v in threads)
               + f"; probe threads per target cycle: "
                 f"{us(lane_cpu(over['threads']) / max(1, over['cycles'] / 2))}",
               f"series: {over['series8']} sample lines in a scrape with the 8 targets"])


def tables(data, params):
    return [overhead_table(data["overhead"]),
            scrapecost.table("3. Scrape cost",
                             f"GET /metrics with 8 targets, {params['requests']} sequential "
                             "keep-alive requests per row, rows alternating in blocks of 25; "
                             "curl's time to the last byte (connect excluded); bytes as sent",
                             data["scrape"])]


SECTION = Section(
    name="overhead", aliases=("scrape", "2", "3"),
    summary="CPU and RSS of the agent (8 targets, 1 s) beside node_exporter, and the "
            "cost of a scrape of each (one run measures both)",
    params=("window", "requests"), default=True, measure=measure, tables=tables)
