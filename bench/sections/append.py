"""Section `append` (7): a 2300-byte write at the end of a new log file + fdatasync,
timed by `stallwatch probe --mode append` against fio's etcd job (as published, which
preallocates the file, and with --fallocate=none, which makes the same calls as the
probe) and two in-process controls (the log kept open; opened and closed around each
request), paced 7 ms (7a) and back to back (7b), after an unmeasured warm-up.
"""

import json
import os
import re
import time

from ..harness import MeasureError, PressureWindow, log, run
from ..results import Goal
from ..stats import fixed, med, pct, pool, ratio, us
from ..tables import Table
from . import Section
from .accuracy import PACE_MS, fio_latencies

APPEND_BS = 2300  # etcd's guidance: fio --rw=write --ioengine=sync --fdatasync=1 --bs=2300
TOOLS = ["sw", "fio", "fio_grow", "ctl_open", "ctl_reopen"]
REFS = ("fio", "fio_grow")
OPS = (("total", "write+fdatasync"), ("write", "write"), ("sync", "fdatasync"))


# ---------------------------------------------------------------------------------------
# The tools


def run_stallwatch_append(binary, fs, n, paced):
    cmd = [str(binary), "probe", str(fs.mnt), "--mode", "append", "--count", str(n),
           "--interval", f"{PACE_MS}ms" if paced else "0", "--size", str(APPEND_BS), "--json"]
    r = run(cmd, timeout=180)
    cyc = json.loads(r.stdout)["cycles"]
    if len(cyc) != n or any("error" in c for c in cyc):
        raise MeasureError(f"stallwatch probe --mode append on {fs.mnt}: {len(cyc)} cycles, "
                           f"errors: {[c['error'] for c in cyc if 'error' in c][:3]}")
    w = [c["write"] for c in cyc]
    s = [c["fdatasync"] for c in cyc]
    return {"write": w, "sync": s, "total": [a + b for a, b in zip(w, s)]}


def run_fio_append(fs, n, work, tag, paced, prealloc):
    """etcd's fio job on a new file of n*2300 bytes. As published (prealloc) fio lays the
    file out with fallocate(0, size) first: the writes fill preallocated extents and the
    size does not change. With --fallocate=none the file starts empty and every write
    extends it, as stallwatch's append does."""
    d = fs.mnt / "fio-append"
    d.mkdir(exist_ok=True)
    logdir = work / "fio-logs"
    logdir.mkdir(exist_ok=True)
    prefix = logdir / tag
    cmd = ["fio", "--name=etcd", f"--directory={d}", "--rw=write", "--ioengine=sync",
           "--fdatasync=1", f"--bs={APPEND_BS}", f"--size={APPEND_BS * n}",
           "--output-format=json+", f"--write_lat_log={prefix}", "--log_avg_msec=0"]
    if not prealloc:
        cmd.append("--fallocate=none")
    if paced:
        cmd.append(f"--rate_iops={1000 // PACE_MS}")
    out = fio_latencies(cmd, prefix)
    for f in d.iterdir():
        f.unlink()
    return out


def run_append_control(fs, n, paced, keep_open):
    """In-process control: 2300-byte O_APPEND write + fdatasync on a new file, the
    descriptor kept open (as fio and a database keep their log) or opened before and
    closed after each request (as stallwatch's append lane does every cycle)."""
    d = fs.mnt / "ctl"
    d.mkdir(exist_ok=True)
    path = d / "append.log"
    flags = os.O_WRONLY | os.O_APPEND | os.O_CREAT
    buf, w, s = os.urandom(APPEND_BS), [], []
    fd = os.open(path, flags, 0o600) if keep_open else None
    due = time.monotonic()
    try:
        for _ in range(n):
            if not keep_open:
                fd = os.open(path, flags, 0o600)
            t0 = time.perf_counter()
            os.write(fd, buf)
            t1 = time.perf_counter()
            os.fdatasync(fd)
            t2 = time.perf_counter()
            w.append(t1 - t0)
            s.append(t2 - t1)
            if not keep_open:
                os.close(fd)
                fd = None
            if paced:
                due += PACE_MS / 1000
                time.sleep(max(0, due - time.monotonic()))
    finally:
        if fd is not None:
            os.close(fd)
        path.unlink()
    return {"write": w, "sync": s, "total": [a + b for a, b in zip(w, s)]}


def describe_call(name, rest, ret):
    if name == "fallocate":
        mode, off, length = [x.strip() for x in rest.lstrip(", ").split(",")]
        return f"fallocate(mode {mode}, offset {off}, length {length})"
    if name == "write":
        return f"write {ret}"
    return name + rest


def fio_append_syscalls(fs, work):
    """strace -f of both fio variants, 4 writes: what each does to the file."""
    out = {}
    d = fs.mnt / "fio-append"
    d.mkdir(exist_ok=True)
    for label, extra in (("etcd job as published", []), ("--fallocate=none", ["--fallocate=none"])):
        cmd = ["strace", "-f", "-e", "trace=fallocate,ftruncate,write,fdatasync",
               "fio", "--name=mix", f"--directory={d}", "--rw=write", "--ioengine=sync",
               "--fdatasync=1", f"--bs={APPEND_BS}", f"--size={4 * APPEND_BS}", *extra,
               "--output=/dev/null"]
        r = run(cmd, timeout=60, cwd=work)
        found = [m.groups() for m in re.finditer(
            r"(fallocate|ftruncate|write|fdatasync)\((\d+)(.*)\)\s+= (\S+)", r.stderr)]
        # The data file is the one fdatasync'ed; fio's pipes and output are not.
        fd = next((f for name, f, _, _ in found if name == "fdatasync"), None)
        out[label] = [describe_call(name, rest, ret) for name, f, rest, ret in found if f == fd]
        for f in d.iterdir():
            f.unlink()
    return out


def run_append_tool(ctx, fs, tool, n, paced, tag):
    """One run of `tool` (one of TOOLS) on `fs`; `tag` names fio's latency log."""
    if tool == "sw":
        return run_stallwatch_append(ctx.binary, fs, n, paced)
    if tool.startswith("ctl"):
        return run_append_control(fs, n, paced, keep_open=(tool == "ctl_open"))
    return run_fio_append(fs, n, ctx.work, tag, paced, prealloc=(tool == "fio"))


def warmup(ctx, fss, n):
    """One unmeasured back-to-back run of every tool on every filesystem before the
    measured rounds. On a new filesystem the first runs of every tool are slower, and
    `stallwatch probe` makes a new .stallwatch directory per run, which XFS (inode64)
    places in the next allocation group: on the 4-AG XFS it runs four times, once per
    allocation group (docs/benchmarks/2026-12-02-runs-11-19.md)."""
    for fs in fss:
        for t in TOOLS:
            for _ in range(4 if t == "sw" and fs.kind == "xfs" else 1):
                run_append_tool(ctx, fs, t, n, False, f"warm-{fs.name}-{t}")
    log(f"append accuracy: warm-up done ({n} requests per tool and filesystem, not counted)")


# ---------------------------------------------------------------------------------------
# One phase


def log_round(label, rnd, rounds, res):
    def pair(x):
        return f"{us(pct(x[-1]['sync'], 50))}/{us(pct(x[-1]['sync'], 99))}"

    log(f"append accuracy {label} round {rnd + 1}/{rounds}: " + "; ".join(
        f"{nm} fdatasync p50/p99 stallwatch {pair(r['sw'])} fio {pair(r['fio'])} "
        f"fio grow {pair(r['fio_grow'])}" for nm, r in res.items()))


def both(x, p):
    """write+fdatasync as the sum of the two ops' percentiles, the one estimator both
    tools give (fio logs no per-request sync latency)."""
    return pct(x["write"], p) + pct(x["sync"], p)


def compare(sw, ref, k, p):
    """stallwatch against a reference on op k at percentile p: pooled and per round."""
    if k == "total":
        sw_r, fi_r = [both(x, p) for x in sw], [both(x, p) for x in ref]
        swp = pct(pool(sw, "write"), p) + pct(pool(sw, "sync"), p)
        fip = pct(pool(ref, "write"), p) + pct(pool(ref, "sync"), p)
    else:
        sw_r, fi_r = [pct(x[k], p) for x in sw], [pct(x[k], p) for x in ref]
        swp, fip = pct(pool(sw, k), p), pct(pool(ref, k), p)
    return {"stallwatch": swp, "ref": fip, "pooled_ratio": ratio(swp, fip),
            "median_round": med([ratio(a, b) for a, b in zip(sw_r, fi_r)])}


def summarise(r):
    """A filesystem's runs: rows[ref][op][p] against each fio variant, stallwatch's
    percentile of the per-cycle sum, the controls, and fio's counts."""
    rows = {ref: {k: {str(p): compare(r["sw"], r[ref], k, p) for p in (50, 99)}
                  for k, _ in OPS} for ref in REFS}
    rows["sw_cycle"] = {str(p): pct(pool(r["sw"], "total"), p) for p in (50, 99)}
    # The controls: the percentile of the per-request sum (pooled), and stallwatch's
    # median round ratio to each on the same estimator as against fio.
    for c in ("ctl_open", "ctl_reopen"):
        rows[c] = {str(p): {"pooled": pct(pool(r[c], "total"), p),
                            "median_round": med([ratio(both(a, p), both(b, p))
                                                 for a, b in zip(r["sw"], r[c])])}
                   for p in (50, 99)}
    rows["fio_counts"] = {t: {"writes": r[t][0]["write_n"], "syncs": r[t][0]["sync_n"]}
                          for t in REFS}
    return rows


def phase(ctx, fss, paced, rounds, n):
    res = {f.name: {t: [] for t in TOOLS} for f in fss}
    label = f"paced {PACE_MS} ms" if paced else "back-to-back"
    pressure = PressureWindow()
    for rnd in range(rounds):
        order = TOOLS[rnd % len(TOOLS):] + TOOLS[:rnd % len(TOOLS)]
        for fs in (fss if rnd % 2 == 0 else fss[::-1]):
            for t in order:
                res[fs.name][t].append(run_append_tool(
                    ctx, fs, t, n, paced, f"ap-{fs.name}-{int(paced)}-{rnd}-{t}"))
        log_round(label, rnd, rounds, res)
    return {"label": label, "rounds": rounds, "n": n, "paced": paced,
            "warmup": ctx.args.append_warmup, "pressure": pressure.share(),
            "fs": {name: summarise(r) for name, r in res.items()}}


# ---------------------------------------------------------------------------------------


def goals(data):
    g = []
    for ph in data["phases"]:
        for fs, r in ph["fs"].items():
            for p in ("50", "99"):
                rm = r["fio"]["total"][p]["median_round"]
                g.append(Goal(f"{fs}: append p{p} / fio etcd within 0.8-1.25 ({ph['label']}, "
                              "median round ratio)", fixed(rm), 0.8 <= rm <= 1.25, rm))
    return g


def measure(ctx):
    a = ctx.args
    xfs0, ext0 = ctx.loops()[:2]
    data = {"fio_syscalls": fio_append_syscalls(xfs0, ctx.work)}
    if a.append_warmup:
        warmup(ctx, [xfs0, ext0], a.append_b2b_count)
    data["phases"] = [phase(ctx, [xfs0, ext0], True, a.append_rounds, a.append_count),
                      phase(ctx, [xfs0, ext0], False, a.append_b2b_rounds, a.append_b2b_count)]
    return data, goals(data)


def control_note(fs, r):
    o, c = r["ctl_open"], r["ctl_reopen"]
    return (f"{fs}: control in-process (Python), write+fdatasync per request, pooled p50 / p99, "
            "and stallwatch's median round ratio to it: descriptor kept open "
            f"{us(o['50']['pooled'])} / {us(o['99']['pooled'])} (ratio "
            f"{fixed(o['50']['median_round'])} / {fixed(o['99']['median_round'])}); opened and "
            f"closed around each request {us(c['50']['pooled'])} / {us(c['99']['pooled'])} "
            f"(ratio {fixed(c['50']['median_round'])} / {fixed(c['99']['median_round'])})")


def phase_table(ph, mix):
    rows = []
    for fs, r in ph["fs"].items():
        for k, lab in OPS:
            for p in ("50", "99"):
                a, b = r["fio"][k][p], r["fio_grow"][k][p]
                rows.append((fs, f"{lab} p{p}", us(a["stallwatch"]), us(a["ref"]),
                             fixed(a["pooled_ratio"]), fixed(a["median_round"]), us(b["ref"]),
                             fixed(b["pooled_ratio"]), fixed(b["median_round"])))
    notes = ["write+fdatasync: the sum of the write and the fdatasync percentile, for both tools "
             "(fio logs no per-request sync time); ratio: of the pooled percentiles; median "
             "round: of the per-round ratios"]
    for fs, r in ph["fs"].items():
        c = r["fio_counts"]
        notes.append(f"{fs}: stallwatch's percentile of the per-cycle sum: p50 "
                     f"{us(r['sw_cycle']['50'])}, p99 {us(r['sw_cycle']['99'])}; fio timed "
                     f"{c['fio']['writes']} writes and {c['fio']['syncs']} syncs per run "
                     f"(fallocate=none: {c['fio_grow']['writes']} / {c['fio_grow']['syncs']})")
    notes += [control_note(fs, r) for fs, r in ph["fs"].items()]
    if mix and ph["paced"]:
        notes += [f"fio {k}, strace of a 4-write run, calls on the file: " + ", ".join(v)
                  for k, v in mix.items()]
    pressure = ph["pressure"]
    return Table(
        title=f"7{'a' if ph['paced'] else 'b'}. Accuracy of append, {ph['label']}",
        caption=f"write of {APPEND_BS} bytes at the end of a new log file + fdatasync, "
                f"{ph['n']} requests per run, {ph['rounds']} interleaved rounds per filesystem"
                + (" after an unmeasured warm-up run of each tool (stallwatch 4 on XFS)"
                   if ph["warmup"] else ", no warm-up")
                + f"; stallwatch probe --mode append --size {APPEND_BS} against fio's etcd job "
                  f"(--rw=write --ioengine=sync --fdatasync=1 --bs={APPEND_BS}) as published and "
                  "with --fallocate=none"
                + (f"; host I/O pressure (PSI some) {100 * pressure:.1f}% of the time"
                   if pressure is not None else ""),
        intro=[f"requests {PACE_MS} ms apart: stallwatch --interval {PACE_MS}ms, fio "
               f"--rate_iops={1000 // PACE_MS}" if ph["paced"] else
               "requests back to back: stallwatch --interval 0, fio unpaced (as etcd's job)"],
        head=("fs", "latency", "stallwatch", "fio etcd", "ratio", "median round",
              "fio fallocate=none", "ratio", "median round"),
        rows=rows, notes=notes)


def tables(data, params):
    return [phase_table(ph, data.get("fio_syscalls")) for ph in data["phases"]]


SECTION = Section(
    name="append", aliases=("7",),
    summary="append (2300 B write+fdatasync) against fio's etcd job, paced and back to "
            "back (only when named)",
    params=("append_rounds", "append_count", "append_b2b_rounds", "append_b2b_count",
            "append_warmup"),
    default=False, measure=measure, tables=tables)
