"""The scrape-cost measurement shared by sections `overhead` (3) and `scale` (6b, 6c,
6d): keep-alive GETs of /metrics, in blocks of 25 that rotate through the rows, timed by
curl to the last byte. A row is a server and what the request asks for: plain or gzip
(3, 6b, 6c: stallwatch and node_exporter), and a format by its Accept header (6d).

Blocks, not single requests alternating, with a 100 ms pause at each switch: on a
2-CPU machine one server's after-work (Go's GC after a 90 KiB scrape) would otherwise
land in the other's timings.

With `cpu_of` (6d) each block is also bracketed by the server's CPU time (the sum of its
threads' schedstat, ns: utime+stime in /proc/PID/stat step by 10 ms, a quarter of a
block's CPU), and one more row takes its turn in the rotation: an idle block, no
request, as long as the block before it. Its CPU is the server's own background (the
probe lanes) over an idle window as long as a mean row's blocks, so a row's CPU per
scrape can be given less that background. utime+stime over the whole measurement is
kept beside the threads' sum as a check that no thread took CPU away when it exited.
"""

import gzip as gz
import time
from dataclasses import dataclass

from .harness import MeasureError, curl_block, proc_stat, task_cpu
from .stats import fixed, med, ms, pct, ratio, us
from .tables import Table


@dataclass(frozen=True)
class Row:
    """One row of a scrape-cost table: `server` (a key of the urls) asked with `accept`
    (None: curl's */*) and gzip or not; `ctype`, when given, the media type and
    parameters its Content-Type must have (else MeasureError)."""

    key: str
    name: str
    server: str
    gzip: bool
    accept: str | None = None
    ctype: tuple | None = None


# Sections 3, 6b, 6c: both servers, plain and gzip, curl's Accept: */* (text).
ROWS = (Row("sw", "stallwatch", "sw", False), Row("ne", "node_exporter", "ne", False),
        Row("sw_gzip", "stallwatch gzip", "sw", True),
        Row("ne_gzip", "node_exporter gzip", "ne", True))

# The Accept headers of 6d. OpenMetrics and protobuf: Prometheus 2.42's own (scrape.go,
# scrapeAcceptHeader and scrapeAcceptHeaderWithProtobuf, the latter with
# --enable-feature=native-histograms); text: a scraper that takes only text 0.0.4.
ACCEPT_TEXT = "text/plain;version=0.0.4"
ACCEPT_OPENMETRICS = ("application/openmetrics-text;version=1.0.0,application/openmetrics-text;"
                      "version=0.0.1;q=0.75,text/plain;version=0.0.4;q=0.5,*/*;q=0.1")
ACCEPT_PROTOBUF = ("application/vnd.google.protobuf;proto=io.prometheus.client.MetricFamily;"
                   "encoding=delimited,application/openmetrics-text;version=1.0.0;q=0.8,"
                   "application/openmetrics-text;version=0.0.1;q=0.75,"
                   "text/plain;version=0.0.4;q=0.5,*/*;q=0.1")

# (key, name, Accept, the Content-Type it must come back with)
FORMATS = (
    ("text", "text 0.0.4", ACCEPT_TEXT, ("text/plain", {"version": "0.0.4"})),
    ("om", "OpenMetrics 1.0.0", ACCEPT_OPENMETRICS,
     ("application/openmetrics-text", {"version": "1.0.0"})),
    ("pb", "protobuf", ACCEPT_PROTOBUF,
     ("application/vnd.google.protobuf",
      {"proto": "io.prometheus.client.MetricFamily", "encoding": "delimited"})),
)


def format_rows(server="sw"):
    """The rows of 6d: every format of FORMATS, plain and gzip, of `server`."""
    return tuple(Row(f"{k}{'_gzip' if z else ''}", f"{name}{' gzip' if z else ''}", server, z,
                     accept, ct)
                 for z in (False, True) for k, name, accept, ct in FORMATS)


IDLE = Row("idle", "idle", "", False)


# ---------------------------------------------------------------------------------------
# What came back


def media_type(ct):
    """A Content-Type as (type/subtype lower-cased, {parameter: value}); parameter
    names lower-cased, values unquoted."""
    parts = [p.strip() for p in (ct or "").split(";")]
    params = {}
    for p in parts[1:]:
        k, sep, v = p.partition("=")
        if sep:
            params[k.strip().lower()] = v.strip().strip('"')
    return parts[0].lower(), params


def ctype_matches(ct, want):
    """True when Content-Type `ct` is `want` = (type, {parameter: value}): the same
    media type and every parameter of `want` with that value (others may be present)."""
    typ, params = media_type(ct)
    wtyp, wparams = want
    return typ == wtyp and all(params.get(k) == v for k, v in wparams.items())


def check_response(row, encoding, ctype, url):
    """MeasureError unless the response is what `row` asked for: gzip-encoded when it
    asked for gzip and not otherwise; of its Content-Type when it names one."""
    if encoding != ("gzip" if row.gzip else ""):
        raise MeasureError(f"{url} ({row.name}): Content-Encoding {encoding!r}")
    if row.ctype and not ctype_matches(ctype, row.ctype):
        raise MeasureError(f"{url} ({row.name}): Content-Type {ctype!r}, asked for {row.ctype}")


def _varint(b, i):
    """The varint at b[i:], and the index after it; ValueError when cut short."""
    x = shift = 0
    while True:
        if i >= len(b) or shift > 63:
            raise ValueError("varint cut short")
        c = b[i]
        x |= (c & 0x7F) << shift
        i += 1
        if c < 0x80:
            return x, i
        shift += 7


def delimited_names(body):
    """The metric family names of a body of length-delimited MetricFamily messages,
    each read from field 1 (name, a string) at the start of its message; ValueError
    when the body is not such a sequence, to its last byte."""
    names, i = [], 0
    while i < len(body):
        n, i = _varint(body, i)
        msg = body[i:i + n]
        if len(msg) != n or not msg or msg[0] != 0x0A:
            raise ValueError(f"not a MetricFamily at byte {i}")
        ln, j = _varint(msg, 1)
        name = msg[j:j + ln]
        if len(name) != ln or not name.replace(b"_", b"").replace(b":", b"").isalnum():
            raise ValueError(f"not a metric name at byte {i}")
        names.append(name.decode())
        i += n
    if not names:
        raise ValueError("empty body")
    return names


def body_format(body):
    """What a /metrics body is, read from the bytes alone: "om" (OpenMetrics text: ends
    with # EOF), "text" (text 0.0.4: starts with # HELP or # TYPE, no # EOF), "pb"
    (length-delimited MetricFamily messages to the last byte) or None."""
    if body.endswith(b"# EOF\n"):
        return "om"
    if body.startswith((b"# HELP ", b"# TYPE ")):
        return "text"
    try:
        delimited_names(body)
        return "pb"
    except ValueError:
        return None


def check_body(client, row):
    """One GET of `row` outside the timings: MeasureError unless the body, gunzipped
    for a gzip row, is of the row's format by its bytes (body_format)."""
    body, _, enc = client.get("/metrics", gzip=row.gzip, accept=row.accept)
    if row.gzip:
        if enc != "gzip":
            raise MeasureError(f"{row.name}: Content-Encoding {enc!r}")
        body = gz.decompress(body)
    got = body_format(body)
    want = row.key.removesuffix("_gzip")
    if got != want:
        raise MeasureError(f"{row.name}: the body reads as {got!r}, not {want!r}: {body[:80]!r}")


# ---------------------------------------------------------------------------------------
# The blocks


def rotation(rows, i):
    """The order of the rows in round i: rotated by i, so that each row follows each
    other row in turn."""
    k = i % len(rows)
    return list(rows[k:]) + list(rows[:k])


def blocks(urls, requests, rows=ROWS, block=25, cpu_of=None):
    """`requests` GETs per row in curl blocks rotating through the rows; per row (by
    its key) the p50, p99 and max seconds, the median bytes and the count.

    cpu_of, a pid: per row also that server's CPU seconds (task_cpu) over its blocks
    and their wall seconds (from before the first reading to after the second); and
    the IDLE row in the rotation (its CPU and wall seconds)."""
    order = list(rows) + ([IDLE] if cpu_of else [])
    res = {r.key: [] for r in rows}
    cpu = {r.key: 0.0 for r in order}
    wall = {r.key: 0.0 for r in order}
    last = 0.0
    for i in range(-(-requests // block)):
        n = min(block, requests - i * block)
        for r in rotation(order, i):
            time.sleep(0.1)
            t0 = time.monotonic()
            c0 = task_cpu(cpu_of) if cpu_of else 0.0
            if r is IDLE:
                time.sleep(last)
            else:
                got = curl_block(urls[r.server], n, r.gzip, r.accept)
            c1 = task_cpu(cpu_of) if cpu_of else 0.0
            t1 = time.monotonic()
            cpu[r.key] += c1 - c0
            wall[r.key] += t1 - t0
            last = t1 - t0
            if r is not IDLE:
                for _, _, enc, ct in got:
                    check_response(r, enc, ct, urls[r.server])
                res[r.key] += got
    out = {}
    for r in rows:
        t = [x[0] for x in res[r.key]]
        out[r.key] = {"p50": pct(t, 50), "p99": pct(t, 99), "max": max(t),
                      "bytes": med([x[1] for x in res[r.key]]), "n": len(t)}
        if cpu_of:
            out[r.key] |= {"cpu": cpu[r.key], "wall": wall[r.key]}
    if cpu_of:
        out["idle"] = {"cpu": cpu["idle"], "wall": wall["idle"]}
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


def by_format(agent, requests):
    """6d: the agent's scrape cost in every format, plain and gzip (format_rows), each
    body checked once by its bytes first; CPU per row and idle (blocks with cpu_of);
    VmRSS and VmHWM before and after."""
    rows = format_rows()
    for r in rows:
        check_body(agent.client, r)
    before, tasks0 = proc_stat(agent.pid), task_cpu(agent.pid)
    out = blocks({"sw": f"http://{agent.addr}/metrics"}, requests, rows, cpu_of=agent.pid)
    after, tasks1 = proc_stat(agent.pid), task_cpu(agent.pid)
    out["mem"] = {"rss_before": before[1], "rss_after": after[1], "hwm_before": before[2],
                  "hwm_after": after[2], "threads_before": before[3], "threads_after": after[3]}
    out["cpu_check"] = {"stat": after[0] - before[0], "tasks": tasks1 - tasks0}
    return out


def cpu_per_scrape(sc, key):
    """A 6d row's server CPU per scrape, gross and less the idle background over its
    blocks' wall time (idle CPU / idle wall × the row's wall), in seconds."""
    r, idle = sc[key], sc["idle"]
    gross = r["cpu"] / r["n"]
    rate = ratio(idle["cpu"], idle["wall"])
    rate = 0.0 if rate != rate else rate  # an idle window without a tick: nothing to subtract
    return gross, (r["cpu"] - rate * r["wall"]) / r["n"]


# ---------------------------------------------------------------------------------------
# Tables


def table(title, caption, sc):
    """The table of section 3 and 6b: both servers, plain and gzip, their p99 ratios,
    server CPU per scrape and peak RSS."""
    rows = [(r.name, ms(sc[r.key]["p50"]), ms(sc[r.key]["p99"]), ms(sc[r.key]["max"]),
             f"{sc[r.key]['bytes']:.0f}") for r in ROWS]
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


def format_table(title, caption, by_n):
    """6d: one row per target count, format and encoding (by_n: {targets: by_format()}):
    latency, bytes, CPU per scrape less the idle background, and each against text's."""
    rows, notes = [], []
    for n, sc in by_n.items():
        for r in format_rows():
            text = "text_gzip" if r.gzip else "text"
            net = cpu_per_scrape(sc, r.key)[1]
            rows.append((n, r.name, ms(sc[r.key]["p50"]), ms(sc[r.key]["p99"]),
                         ms(sc[r.key]["max"]), f"{sc[r.key]['bytes']:.0f}", ms(net),
                         fixed(ratio(sc[r.key]["p99"], sc[text]["p99"]), 2),
                         fixed(ratio(net, cpu_per_scrape(sc, text)[1]), 2),
                         fixed(ratio(sc[r.key]["bytes"], sc[text]["bytes"]), 2)))
        idle, m = sc["idle"], sc["mem"]
        gross = [cpu_per_scrape(sc, r.key)[0] for r in format_rows()]
        notes.append(
            f"{n} targets: idle background {us(idle['cpu'])} of CPU in "
            f"{idle['wall']:.2f} s of idle blocks ({100 * ratio(idle['cpu'], idle['wall']):.2f} % "
            f"of a core), subtracted per row over its blocks' wall time; CPU per scrape before "
            f"that {ms(min(gross))}-{ms(max(gross))}; the whole measurement: threads' "
            f"schedstat {sc['cpu_check']['tasks']:.2f} s, utime+stime "
            f"{sc['cpu_check']['stat']:.2f} s; VmRSS {m['rss_before'] / 1024:.1f} MiB "
            f"before, {m['rss_after'] / 1024:.1f} MiB after, VmHWM {m['hwm_after'] / 1024:.1f} MiB")
    return Table(title=title, caption=caption,
                 head=("targets", "format", "p50", "p99", "max", "bytes", "CPU/scrape",
                       "p99/text", "CPU/text", "bytes/text"),
                 rows=rows, notes=notes)
