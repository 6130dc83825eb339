"""Section `accuracy` (1): a 4 KiB pwrite at offset 0 + fdatasync, timed by
`stallwatch probe`, ioping and fio on the same XFS and ext4 loop filesystems, paced
7 ms (1a, the goals) and back to back (1b, with in-process controls).

Rounds rotate the order of the tools and alternate the filesystems. Percentiles are of
the samples pooled over all rounds; ratios are given of the pooled percentiles and as
the median of the per-round ratios (the goals are judged on the latter).
"""

import json
import os
import time

from ..harness import MeasureError, PressureWindow, log, run
from ..results import Goal
from ..stats import NAN, fixed, med, pct, pool, ratio, us
from ..tables import Table
from . import Section

# Pacing of the headline comparison: every request in a new clock tick (4 ms at HZ=250),
# as in the agent, where cycles are seconds apart. Back-to-back requests (interval 0) land
# several per tick and then skip the mtime update unless the inode's times were read since
# the last change (multigrain timestamps, Linux 6.13+). stallwatch's per-cycle check of
# the probe file used fstat, which reads them, until it moved to statx without
# timestamps; the control below still shows the effect. Both pacings are reported.
PACE_MS = 7

LATENCY_ROWS = (("total_p50", "write+fdatasync p50", "ioping"),
                ("total_p99", "write+fdatasync p99", "ioping"),
                ("write_p50", "write p50", "fio"), ("write_p99", "write p99", "fio"),
                ("sync_p50", "fdatasync p50", "fio"), ("sync_p99", "fdatasync p99", "fio"))


# ---------------------------------------------------------------------------------------
# The tools


def run_stallwatch_probe(binary, fs, n, paced):
    cmd = [str(binary), "probe", str(fs.mnt), "--mode", "overwrite", "--sync", "fdatasync",
           "--count", str(n), "--interval", f"{PACE_MS}ms" if paced else "0", "--size", "4KiB",
           "--json"]
    t0 = time.perf_counter()
    r = run(cmd, timeout=120)
    wall = time.perf_counter() - t0
    j = json.loads(r.stdout)
    cyc = j["cycles"]
    if len(cyc) != n or any("error" in c for c in cyc):
        raise MeasureError(f"stallwatch probe on {fs.mnt}: {len(cyc)} cycles, errors: "
                           f"{[c['error'] for c in cyc if 'error' in c][:3]}")
    w = [c["write"] for c in cyc]
    s = [c["fdatasync"] for c in cyc]
    summ = j["summary"]
    for k in ("write", "fdatasync"):
        if set(summ[k]) != {"count", "min", "mean", "p50", "p90", "p99", "max"}:
            raise MeasureError(f"stallwatch probe --json summary keys: {sorted(summ[k])}")
    return {"write": w, "sync": s, "total": [a + b for a, b in zip(w, s)], "wall": wall}


def run_ioping(fs, n, paced):
    # -c counts the warm-up request ioping discards; -p 1 -q: one raw line per request:
    # count, time_ns, iops, bytes/s, min, avg, max, mdev, requests, wall_ns (of the period).
    cmd = ["ioping", "-W", "-s", "4k", "-S", "4k", "-c", str(n + 1), "-i",
           f"{PACE_MS}ms" if paced else "0", "-p", "1", "-q", str(fs.mnt / "ioping")]
    r = run(cmd, timeout=120)
    lat, gap = [], []
    for i, ln in enumerate(r.stdout.splitlines()):
        f = ln.split()
        if len(f) != 10:
            continue
        lat.append(int(f[1]) / 1e9)
        if i > 0:  # the first period also holds the warm-up request
            gap.append((int(f[9]) - int(f[1])) / 1e9)
    if len(lat) != n:
        raise MeasureError(f"ioping printed {len(lat)} requests, expected {n}: {r.stdout[-300:]}")
    return {"total": lat, "gap": gap}


def fio_latencies(cmd, prefix, timeout=180):
    """Runs fio with --output-format=json+ and a per-I/O write latency log at prefix:
    the writes' latencies from the log, the syncs' expanded from json+'s histogram."""
    r = run(cmd, timeout=timeout)
    job = json.loads(r.stdout[r.stdout.index("{"):])["jobs"][0]
    clat = [int(ln.split(",")[1]) / 1e9 for ln in open(f"{prefix}_clat.1.log") if ln.strip()]
    for f in prefix.parent.glob(f"{prefix.name}_*.log"):
        f.unlink()
    # Sync latencies are not in the per-I/O logs; json+ has their histogram (fio's
    # log-linear bins, under 2% wide), expanded here into samples at the bin values.
    sync = [int(v) / 1e9 for v, c in job["sync"]["lat_ns"]["bins"].items() for _ in range(c)]
    return {"write": clat, "sync": sync, "write_n": job["write"]["total_ios"],
            "sync_n": job["sync"]["lat_ns"]["N"]}


def run_fio(fs, n, work, tag, paced):
    # randwrite + norandommap over a 4 KiB file: every request rewrites offset 0 without
    # fio's end-of-file wrap (which reopens the file and adds a sync of a clean file).
    # Pacing with rate_iops (it sleeps after the sync); thinktime would sleep between
    # the pwrite and its fdatasync, since fio counts the sync as an I/O of its own.
    logdir = work / "fio-logs"
    logdir.mkdir(exist_ok=True)
    prefix = logdir / tag
    cmd = ["fio", "--name=acc", f"--filename={fs.fio_file}", "--rw=randwrite", "--norandommap",
           "--randrepeat=0", "--bs=4k", "--size=4k", f"--io_size={4 * n}k", "--ioengine=psync",
           "--fdatasync=1", "--invalidate=0", "--output-format=json+",
           f"--write_lat_log={prefix}", "--log_avg_msec=0"]
    if paced:
        cmd.append(f"--rate_iops={1000 // PACE_MS}")
    return fio_latencies(cmd, prefix)


def fio_syscall_mix(fs, work):
    """strace -f -c of fio with the variant we use and with the obvious one (rw=write)."""
    out = {}
    for label, extra in (("randwrite+norandommap (used)", ["--rw=randwrite", "--norandommap"]),
                         ("rw=write, io_size wraps", ["--rw=write"])):
        cmd = ["strace", "-f", "-c", "-e", "trace=pwrite64,fdatasync,fsync,openat,fadvise64",
               "fio", "--name=mix", f"--filename={fs.fio_file}", *extra, "--bs=4k", "--size=4k",
               "--io_size=200k", "--ioengine=psync", "--fdatasync=1", "--invalidate=0",
               "--output=/dev/null"]
        r = run(cmd, timeout=60, cwd=work)
        counts = {}
        for ln in r.stderr.splitlines():
            f = ln.split()
            if f and f[-1] in ("pwrite64", "fdatasync", "fsync", "fadvise64"):
                counts[f[-1]] = int(f[3])
        out[label] = counts
    return out


def run_control(fs, n, fstat):
    """In-process control: pwrite+fdatasync on a descriptor kept open, optionally with an
    fstat before each request (as stallwatch's per-cycle open did before it used statx
    without timestamps). Times only the pair."""
    d = fs.mnt / "ctl"
    d.mkdir(exist_ok=True)
    fd = os.open(d / "f.dat", os.O_WRONLY | os.O_CREAT, 0o600)
    try:
        os.pwrite(fd, b"\0" * 4096, 0)
        os.fsync(fd)
        buf, lat = os.urandom(4096), []
        for _ in range(n):
            if fstat:
                os.fstat(fd)
            t0 = time.perf_counter()
            os.pwrite(fd, buf, 0)
            os.fdatasync(fd)
            lat.append(time.perf_counter() - t0)
    finally:
        os.close(fd)
    return {"total": lat}


# ---------------------------------------------------------------------------------------
# One phase: rounds of every tool on both filesystems


def run_tool(ctx, fs, tool, r, n, paced, tag):
    """One run of `tool` on fs, appended to r (the filesystem's runs by tool)."""
    if tool == "sw":
        full = run_stallwatch_probe(ctx.binary, fs, n, paced)
        r["sw"].append(full)
        if not paced:
            # Per-cycle time outside the timed calls: wall time not covered by
            # the reported latencies, less the fixed start/exit cost of 1 cycle.
            one = run_stallwatch_probe(ctx.binary, fs, 1, False)
            r["gap"].append(((full["wall"] - sum(full["total"]))
                             - (one["wall"] - sum(one["total"]))) / (n - 1))
    elif tool in ("ctl", "ctl_fstat"):
        r[tool].append(run_control(fs, n, tool == "ctl_fstat"))
    elif tool == "io":
        x = run_ioping(fs, n, paced)
        r["io"].append(x)
        r["io_gap"].append(med(x["gap"]))
    else:
        r["fio"].append(run_fio(fs, n, ctx.work, tag, paced))


def log_round(label, rnd, rounds, res):
    log(f"accuracy {label} round {rnd + 1}/{rounds}: " + "; ".join(
        f"{nm} p50/p99 stallwatch {us(pct(r['sw'][-1]['total'], 50))}/{us(pct(r['sw'][-1]['total'], 99))}"
        f" ioping {us(pct(r['io'][-1]['total'], 50))}/{us(pct(r['io'][-1]['total'], 99))}"
        f" fio sync {us(pct(r['fio'][-1]['sync'], 50))}/{us(pct(r['fio'][-1]['sync'], 99))}"
        for nm, r in res.items()))


def summarise(r):
    """A filesystem's runs as the rows of its table."""
    rows = {}
    for p in (50, 99):
        sw_r = [pct(x["total"], p) for x in r["sw"]]
        io_r = [pct(x["total"], p) for x in r["io"]]
        swp, iop = pct(pool(r["sw"], "total"), p), pct(pool(r["io"], "total"), p)
        rows[f"total_p{p}"] = {
            "stallwatch": swp, "ioping": iop,
            "fio": pct(pool(r["fio"], "write"), p) + pct(pool(r["fio"], "sync"), p),
            "pooled_ratio": ratio(swp, iop),
            "median_round": med([ratio(a, b) for a, b in zip(sw_r, io_r)])}
        for k in ("write", "sync"):
            sw_r = [pct(x[k], p) for x in r["sw"]]
            fi_r = [pct(x[k], p) for x in r["fio"]]
            swp, fip = pct(pool(r["sw"], k), p), pct(pool(r["fio"], k), p)
            rows[f"{k}_p{p}"] = {"stallwatch": swp, "ioping": NAN, "fio": fip,
                                 "pooled_ratio": ratio(swp, fip),
                                 "median_round": med([ratio(a, b) for a, b in zip(sw_r, fi_r)])}
    rows["gap"] = {"stallwatch": med(r["gap"]), "ioping": med(r["io_gap"])}
    if r["ctl"]:
        rows["ctl"] = {"plain": pct(pool(r["ctl"], "total"), 50),
                       "fstat": pct(pool(r["ctl_fstat"], "total"), 50)}
    rows["fio_counts"] = {"writes": r["fio"][0]["write_n"], "syncs": r["fio"][0]["sync_n"]}
    return rows


def phase(ctx, fss, paced, rounds, n):
    res = {f.name: {"sw": [], "io": [], "fio": [], "gap": [], "io_gap": [], "ctl": [],
                    "ctl_fstat": []} for f in fss}
    tools = ["sw", "io", "fio"] + ([] if paced else ["ctl", "ctl_fstat"])
    label = f"paced {PACE_MS} ms" if paced else "back-to-back"
    pressure = PressureWindow()
    for rnd in range(rounds):
        order = tools[rnd % len(tools):] + tools[:rnd % len(tools)]
        for fs in (fss if rnd % 2 == 0 else fss[::-1]):
            for t in order:
                run_tool(ctx, fs, t, res[fs.name], n, paced, f"{fs.name}-{int(paced)}-{rnd}")
        log_round(label, rnd, rounds, res)
    return {"label": label, "rounds": rounds, "n": n, "paced": paced,
            "pressure": pressure.share(),
            "fs": {name: summarise(r) for name, r in res.items()}}


# ---------------------------------------------------------------------------------------


def goals(data):
    g = []
    for fs, r in next((p["fs"] for p in data["phases"] if p["paced"]), {}).items():
        # Judged on the median of the per-round ratios: each round pairs runs seconds
        # apart, and the median drops rounds in which a burst of foreign I/O hit one tool.
        for p, lim in ((50, 0.10), (99, 0.25)):
            v = r[f"total_p{p}"]["median_round"]
            g.append(Goal(f"{fs}: p{p} within {lim * 100:.0f}% of ioping (paced, median round ratio)",
                          fixed(v), abs(v - 1) <= lim, v))
    return g


def measure(ctx):
    a = ctx.args
    xfs0, ext0 = ctx.loops()[:2]
    data = {"fio_syscalls": fio_syscall_mix(xfs0, ctx.work),
            "phases": [phase(ctx, [xfs0, ext0], True, a.rounds, a.count),
                       phase(ctx, [xfs0, ext0], False, a.b2b_rounds, a.b2b_count)]}
    return data, goals(data)


def phase_table(ph):
    paced = ph["paced"]
    rows = []
    for fs, r in ph["fs"].items():
        for key, label, ref in LATENCY_ROWS:
            x = r[key]
            fio = ("≈" + us(x["fio"])) if key.startswith("total") else us(x["fio"])
            rows.append((fs, label, us(x["stallwatch"]), us(x["ioping"]), fio, ref,
                         fixed(x["pooled_ratio"]), fixed(x["median_round"])))
    notes = ["fio ≈: fio times the pwrite (clat log) and the fdatasync (sync percentiles) "
             "separately; ≈ is the sum of the two percentiles, for scale only."]
    if not paced:
        notes.append("control (in-process, fd kept open, 4 KiB pwrite+fdatasync back to back), "
                     "pooled p50: " + "; ".join(
                         f"{fs}: plain {us(r['ctl']['plain'])}, with an fstat before each request "
                         f"{us(r['ctl']['fstat'])} ({ratio(r['ctl']['fstat'], r['ctl']['plain']):.2f}x)"
                         for fs, r in ph["fs"].items()))
    for fs, r in ph["fs"].items():
        if not paced:
            notes.append(f"{fs}: time per cycle outside the timed calls: stallwatch "
                         f"{us(r['gap']['stallwatch'])} (openat+statx+close of the probe file, "
                         f"thread hand-off), ioping {us(r['gap']['ioping'])} per request")
        notes.append(f"{fs}: fio timed {r['fio_counts']['writes']} writes and "
                     f"{r['fio_counts']['syncs']} syncs per run")
    pressure = ph["pressure"]
    return Table(
        title=f"1{'a' if paced else 'b'}. Accuracy, {ph['label']}",
        caption=f"4 KiB pwrite at offset 0 + fdatasync, {ph['n']} requests per run, "
                f"{ph['rounds']} interleaved rounds per filesystem; percentiles of the pooled "
                "samples of all rounds; ratio: of the pooled percentiles, and the median of the "
                "per-round ratios"
                + (f"; host I/O pressure (PSI some) {100 * pressure:.1f}% of the time"
                   if pressure is not None else ""),
        intro=[f"requests {PACE_MS} ms apart: stallwatch --interval {PACE_MS}ms, ioping -i "
               f"{PACE_MS}ms, fio --rate_iops={1000 // PACE_MS}" if paced else
               "requests back to back: stallwatch --interval 0, ioping -i 0, fio unpaced"],
        head=("fs", "latency", "stallwatch", "ioping", "fio", "ref", "stallwatch/ref",
              "median round ratio"),
        rows=rows, notes=notes)


def tables(data, params):
    out = [phase_table(ph) for ph in data["phases"]]
    mix = data.get("fio_syscalls")
    if mix:
        out[-1].notes.append("fio syscall mix (strace -f -c, 50 requests): " + "; ".join(
            f"{k}: " + ", ".join(f"{n}={c}" for n, c in v.items()) for k, v in mix.items()))
    return out


SECTION = Section(
    name="accuracy", aliases=("1",),
    summary="4 KiB write+fdatasync against ioping and fio, paced and back to back",
    params=("rounds", "count", "b2b_rounds", "b2b_count"), default=True,
    measure=measure, tables=tables)
