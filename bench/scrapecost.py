"""The scrape-cost measurement shared by sections `overhead` (3) and `scale` (6b, 6c):
keep-alive GETs of /metrics from stallwatch and node_exporter, plain and gzip, in
blocks of 25 that rotate through the four rows, timed by curl to the last byte.

Blocks, not single requests alternating, with a 100 ms pause at each switch: on a
2-CPU machine one server's after-work (Go's GC after a 90 KiB scrape) would otherwise
land in the other's timings.
"""

import time

from .harness import MeasureError, curl_block, proc_stat
from .stats import fixed, med, ms, pct, ratio
from .tables import Table

# (server, gzip, the row's key in results, its name in tables)
ROWS = (("sw", False, "sw", "stallwatch"), ("ne", False, "ne", "node_exporter"),
        ("sw", True, "sw_gzip", "stallwatch gzip"), ("ne", True, "ne_gzip", "node_exporter gzip"))


def blocks(urls, requests, block=25):
    """`requests` GETs per row in curl blocks rotating through the rows; per row the
    p50, p99 and max seconds, the median bytes and the count."""
    combos = [(srv, gz) for srv, gz, _, _ in ROWS]
    res = {c: [] for c in combos}
    for i in range(-(-requests // block)):
        for c in combos[i % len(combos):] + combos[:i % len(combos)]:
            time.sleep(0.1)
            got = curl_block(urls[c[0]], min(block, requests - i * block), c[1])
            if c[1] and any(e != "gzip" for _, _, e in got):
                raise MeasureError(f"{c[0]} did not gzip /metrics: {got[0]}")
            res[c] += got
    out = {}
    for srv, gz, key, _ in ROWS:
        t = [x[0] for x in res[(srv, gz)]]
        out[key] = {"p50": pct(t, 50), "p99": pct(t, 99), "max": max(t),
                    "bytes": med([x[1] for x in res[(srv, gz)]]), "n": len(t)}
    return out


def with_cpu(agent, ne, requests):
    """blocks() of both servers, and each server's CPU per scrape over the burst and
    peak RSS after it."""
    urls = {"sw": f"http://{agent.addr}/metrics", "ne": f"http://{ne.addr}/metrics"}
    c0 = {"sw": proc_stat(agent.pid)[0], "ne": proc_stat(ne.pid)[0]}
    out = blocks(urls, requests)
    c1 = {"sw": proc_stat(agent.pid), "ne": proc_stat(ne.pid)}
    out["cpu"] = {k: {"cpu_per_scrape": (c1[k][0] - c0[k]) / (2 * requests),
                      "hwm_after": c1[k][2]} for k in ("sw", "ne")}
    return out


def table(title, caption, sc):
    """The table of section 3 and 6b: both servers, plain and gzip, their p99 ratios,
    server CPU per scrape and peak RSS."""
    rows = [(name, ms(sc[key]["p50"]), ms(sc[key]["p99"]), ms(sc[key]["max"]),
             f"{sc[key]['bytes']:.0f}") for _, _, key, name in ROWS]
    notes = [f"p99 ratio stallwatch/node_exporter ({lab}): "
             f"{fixed(ratio(sc[sw]['p99'], sc[ne]['p99']))}"
             for sw, ne, lab in (("sw", "ne", "plain"), ("sw_gzip", "ne_gzip", "gzip"))]
    cpu = sc["cpu"]
    notes.append(f"server CPU per scrape (mean over the burst): stallwatch "
                 f"{cpu['sw']['cpu_per_scrape'] * 1e3:.2f} ms, node_exporter "
                 f"{cpu['ne']['cpu_per_scrape'] * 1e3:.2f} ms; peak RSS after the burst: "
                 f"stallwatch {cpu['sw']['hwm_after'] / 1024:.1f} MiB, node_exporter "
                 f"{cpu['ne']['hwm_after'] / 1024:.1f} MiB")
    return Table(title=title, caption=caption, head=("server", "p50", "p99", "max", "bytes"),
                 rows=rows, notes=notes)
