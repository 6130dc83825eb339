#!/usr/bin/env python3
"""stallwatch benchmark: accuracy, overhead, scrape cost, detection delay, cardinality;
on request, cost at 64 targets and the accuracy of the append probe.

One command, run as root from anywhere:

    bench/run.py                 # full run of sections 1-5, about 4.5 minutes
    bench/run.py --quick         # smoke run (short windows, fewer rounds), under 1 minute
    bench/run.py --only 6,7      # 64 targets (tmpfs + loop) and append against fio's etcd job

It needs the release binary (cargo build --release), fio, ioping, strace, curl,
prometheus-node-exporter, mkfs.xfs, mkfs.ext4, losetup, fsfreeze. It creates its own
loop filesystems in a temporary directory and undoes everything (thaw, stop its own
processes by pid, unmount, detach, delete) on every exit path, Ctrl-C included.

Exit status: 0 when the run completed (goals met or not; the table says which, and
--strict turns a missed goal into 1), 1 when a measurement could not be taken, 2 on a
setup failure (missing tool, not root, agent does not start).

Everything is measured side by side and interleaved: rounds rotate the order of the
tools and alternate the filesystems, scrape requests alternate the servers in blocks,
so drift on a shared machine hits every column alike. Latency percentiles are of the
samples pooled over all rounds; ratios are given both of the pooled percentiles and as
the median of the per-round ratios (the goals are judged on the latter, which drops the
rounds in which a burst of foreign I/O hit one tool). Results: BENCHMARKS.md.
"""

import argparse
import hashlib
import http.client
import json
import os
import random
import re
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
NODE_EXPORTER = "/usr/bin/prometheus-node-exporter"
CLK_TCK = os.sysconf("SC_CLK_TCK")


class SetupError(Exception):
    """The benchmark cannot run here (exit 2)."""


class MeasureError(Exception):
    """A measurement could not be taken (exit 1)."""


def log(msg):
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


# ---------------------------------------------------------------------------------------
# Undo stack: everything the run creates registers its undo here, run LIFO on every exit.


class Undo:
    def __init__(self):
        self.stack = []
        self.frozen = set()
        self.lock = threading.Lock()

    def push(self, what, fn):
        with self.lock:
            self.stack.append((what, fn))

    def run_all(self):
        # Thaw first, whatever the order: a frozen filesystem blocks its processes,
        # and a blocked process can be neither stopped nor unmounted under.
        for d in list(self.frozen):
            thaw(d, self)
        while True:
            with self.lock:
                if not self.stack:
                    break
                what, fn = self.stack.pop()
            try:
                fn()
            except Exception as e:  # noqa: BLE001 - keep undoing the rest
                print(f"cleanup: {what}: {e}", file=sys.stderr)


UNDO = Undo()


def thaw(d, undo=UNDO):
    subprocess.run(["fsfreeze", "-u", str(d)], capture_output=True, timeout=30)
    undo.frozen.discard(d)


def on_signal(signum, _frame):
    raise KeyboardInterrupt(f"signal {signum}")


def run(cmd, timeout=60, check=True, **kw):
    try:
        r = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, **kw)
    except subprocess.TimeoutExpired as e:
        raise MeasureError(f"{cmd[0]} timed out after {timeout}s") from e
    if check and r.returncode != 0:
        raise MeasureError(f"{' '.join(map(str, cmd))}: exit {r.returncode}: {r.stderr.strip()[-500:]}")
    return r


def start_proc(cmd, log_path, what):
    """Starts a process in its own session (a Ctrl-C reaches only us); stopped by pid."""
    f = open(log_path, "w")
    p = subprocess.Popen(cmd, stdout=f, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                         start_new_session=True)
    f.close()
    UNDO.push(f"stop {what} (pid {p.pid})", lambda: stop_proc(p))
    return p


def stop_proc(p, grace=10):
    if p.poll() is not None:
        return
    p.send_signal(signal.SIGTERM)
    try:
        p.wait(grace)
    except subprocess.TimeoutExpired:
        p.kill()
        p.wait(5)


# ---------------------------------------------------------------------------------------
# Statistics


def pct(values, p):
    """Nearest-rank percentile (the same definition stallwatch probe uses)."""
    s = sorted(values)
    if not s:
        return float("nan")
    k = max(1, min(len(s), -(-len(s) * p // 100)))
    return s[int(k) - 1]


def med(xs):
    xs = [x for x in xs if x == x]
    return statistics.median(xs) if xs else float("nan")


def us(s):
    return "n/a" if s != s else f"{s * 1e6:.0f} µs" if s < 1e-3 else f"{s * 1e3:.2f} ms"


def ms(s):
    return "n/a" if s != s else f"{s * 1e3:.2f} ms"


def ratio(a, b):
    return a / b if b and a == a and b == b else float("nan")


# ---------------------------------------------------------------------------------------
# Loop filesystems


class Fs:
    def __init__(self, work, kind, idx):
        self.kind = kind
        self.name = f"{kind[0]}{idx}"  # x0, e0, ...
        self.img = work / f"{self.name}.img"
        self.mnt = work / "mnt" / self.name
        self.dev = None

    def create(self):
        self.mnt.mkdir(parents=True, exist_ok=True)
        UNDO.push(f"rmdir {self.mnt}", lambda: self.mnt.rmdir())
        # XFS refuses images under 300 MiB; sparse, so the size costs nothing.
        run(["truncate", "-s", "320M", str(self.img)])
        UNDO.push(f"rm {self.img}", lambda: self.img.unlink())
        self.dev = run(["losetup", "-f", "--show", str(self.img)]).stdout.strip()
        UNDO.push(f"losetup -d {self.dev}", lambda: run(["losetup", "-d", self.dev], check=False))
        if self.kind == "xfs":
            run(["mkfs.xfs", "-q", "-f", self.dev])
        else:
            run(["mkfs.ext4", "-q", "-F", self.dev])
        run(["mount", self.dev, str(self.mnt)])
        UNDO.push(f"umount {self.mnt}", lambda: umount(self.mnt))
        (self.mnt / "ioping").mkdir()
        (self.mnt / "fio").mkdir()
        self.fio_file = self.mnt / "fio" / "fio.dat"
        with open(self.fio_file, "wb") as f:
            f.write(os.urandom(4096))
            f.flush()
            os.fsync(f.fileno())
        return self


def umount(mnt):
    for _ in range(10):  # a process we just stopped may still hold it for a moment
        if run(["umount", str(mnt)], timeout=60, check=False).returncode == 0:
            return
        time.sleep(0.5)
    run(["umount", "-l", str(mnt)], timeout=60)


# ---------------------------------------------------------------------------------------
# HTTP


class Client:
    """A keep-alive HTTP/1.1 client for one server; times a request to the last byte."""

    def __init__(self, addr):
        host, port = addr.rsplit(":", 1)
        self.host, self.port = host, int(port)
        self.conn = None

    def get(self, path="/metrics", gzip=False, timeout=5):
        headers = {"Accept-Encoding": "gzip"} if gzip else {"Accept-Encoding": "identity"}
        for attempt in (1, 2):
            if self.conn is None:
                self.conn = http.client.HTTPConnection(self.host, self.port, timeout=timeout)
            try:
                t0 = time.perf_counter()
                self.conn.request("GET", path, headers=headers)
                r = self.conn.getresponse()
                body = r.read()
                dt = time.perf_counter() - t0
                if r.status != 200:
                    raise MeasureError(f"GET {path} on {self.host}:{self.port}: HTTP {r.status}")
                return body, dt, r.getheader("Content-Encoding")
            except (OSError, http.client.HTTPException):
                self.conn.close()
                self.conn = None
                if attempt == 2:
                    raise
        raise AssertionError

    def close(self):
        if self.conn:
            self.conn.close()


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def samples(text):
    """Non-comment lines of a Prometheus text scrape."""
    return [ln for ln in text.splitlines() if ln and not ln.startswith("#")]


def metric_values(text, name, target):
    pat = re.compile(r'^' + re.escape(name) + r'\{([^}]*)\} (\S+)$')
    out = []
    for ln in text.splitlines():
        m = pat.match(ln)
        if m and f'target="{target}"' in m.group(1):
            out.append(float(m.group(2)))
    return out


# ---------------------------------------------------------------------------------------
# Agent


class Agent:
    def __init__(self, binary, work, name, config):
        self.cfg = work / f"{name}.yaml"
        self.log = work / f"{name}.log"
        self.cfg.write_text(config)
        self.proc = start_proc([str(binary), "--config", str(self.cfg),
                                "--web.listen-address", "127.0.0.1:0"], self.log, f"stallwatch {name}")
        self.addr = None
        deadline = time.monotonic() + 15
        while time.monotonic() < deadline:
            m = re.search(r"listening on (\S+?)\"? ", self.log.read_text())
            if m:
                self.addr = m.group(1)
                break
            if self.proc.poll() is not None:
                break
            time.sleep(0.05)
        if not self.addr:
            raise SetupError(f"stallwatch did not start ({self.log}):\n{self.log.read_text()[-2000:]}")
        self.client = Client(self.addr)

    def scrape(self):
        return self.client.get()[0].decode()

    def stop(self):
        self.client.close()
        stop_proc(self.proc)


def target_yaml(fss, extra=""):
    return "targets:\n" + "".join(f"  - path: {f.mnt}\n    name: {f.name}\n{extra}" for f in fss)


def proc_stat(pid):
    """(cpu seconds utime+stime, VmRSS KiB, VmHWM KiB, threads)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    cpu = (int(fields[11]) + int(fields[12])) / CLK_TCK
    st = Path(f"/proc/{pid}/status").read_text()
    get = lambda k: int(re.search(rf"^{k}:\s+(\d+)", st, re.M).group(1))  # noqa: E731
    return cpu, get("VmRSS"), get("VmHWM"), get("Threads")


# ---------------------------------------------------------------------------------------
# 1. Accuracy


# Pacing of the headline comparison: every request in a new clock tick (4 ms at HZ=250),
# as in the agent, where cycles are seconds apart. Back-to-back requests (interval 0) land
# several per tick and then skip the mtime update unless the inode's times were read since
# the last change (multigrain timestamps, Linux 6.13+). stallwatch's per-cycle check of
# the probe file used fstat, which reads them, until it moved to statx without
# timestamps; the control below still shows the effect. Both pacings are reported.
PACE_MS = 7


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
    r = run(cmd, timeout=180)
    job = json.loads(r.stdout[r.stdout.index("{"):])["jobs"][0]
    clat = [int(ln.split(",")[1]) / 1e9 for ln in open(f"{prefix}_clat.1.log") if ln.strip()]
    for f in logdir.glob(f"{tag}_*.log"):
        f.unlink()
    # Sync latencies are not in the per-I/O logs; json+ has their histogram (fio's
    # log-linear bins, under 2% wide), expanded here into samples at the bin values.
    sync = [int(v) / 1e9 for v, c in job["sync"]["lat_ns"]["bins"].items() for _ in range(c)]
    return {"write": clat, "sync": sync, "write_n": job["write"]["total_ios"],
            "sync_n": job["sync"]["lat_ns"]["N"]}


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


def io_pressure():
    try:
        m = re.search(r"some .*total=(\d+)", Path("/proc/pressure/io").read_text())
        return int(m.group(1)) / 1e6 if m else None
    except OSError:
        return None


def accuracy(args, fss, paced, rounds, n):
    res = {f.name: {"sw": [], "io": [], "fio": [], "gap": [], "io_gap": [], "ctl": [],
                    "ctl_fstat": []} for f in fss}
    tools = ["sw", "io", "fio"] + ([] if paced else ["ctl", "ctl_fstat"])
    label = f"paced {PACE_MS} ms" if paced else "back-to-back"
    p0, t0 = io_pressure(), time.monotonic()
    for rnd in range(rounds):
        order = tools[rnd % len(tools):] + tools[:rnd % len(tools)]
        for fs in (fss if rnd % 2 == 0 else fss[::-1]):
            r = res[fs.name]
            for t in order:
                if t == "sw":
                    full = run_stallwatch_probe(args.bin, fs, n, paced)
                    r["sw"].append(full)
                    if not paced:
                        # Per-cycle time outside the timed calls: wall time not covered by
                        # the reported latencies, less the fixed start/exit cost of 1 cycle.
                        one = run_stallwatch_probe(args.bin, fs, 1, False)
                        r["gap"].append(((full["wall"] - sum(full["total"]))
                                         - (one["wall"] - sum(one["total"]))) / (n - 1))
                elif t in ("ctl", "ctl_fstat"):
                    r[t].append(run_control(fs, n, t == "ctl_fstat"))
                elif t == "io":
                    x = run_ioping(fs, n, paced)
                    r["io"].append(x)
                    r["io_gap"].append(med(x["gap"]))
                else:
                    r["fio"].append(run_fio(fs, n, args.work, f"{fs.name}-{int(paced)}-{rnd}", paced))
        log(f"accuracy {label} round {rnd + 1}/{rounds}: " + "; ".join(
            f"{nm} p50/p99 stallwatch {us(pct(r['sw'][-1]['total'], 50))}/{us(pct(r['sw'][-1]['total'], 99))}"
            f" ioping {us(pct(r['io'][-1]['total'], 50))}/{us(pct(r['io'][-1]['total'], 99))}"
            f" fio sync {us(pct(r['fio'][-1]['sync'], 50))}/{us(pct(r['fio'][-1]['sync'], 99))}"
            for nm, r in res.items()))
    p1, t1 = io_pressure(), time.monotonic()
    out = {"label": label, "rounds": rounds, "n": n, "paced": paced,
           "pressure": (p1 - p0) / (t1 - t0) if p0 is not None else None, "fs": {}}
    for name, r in res.items():
        rows = {}
        pool = lambda runs, k: [x for run_ in runs for x in run_[k]]  # noqa: E731
        for p in (50, 99):
            # (stallwatch, ioping, fio, ratio of pooled percentiles, median of round ratios)
            sw_r = [pct(x["total"], p) for x in r["sw"]]
            io_r = [pct(x["total"], p) for x in r["io"]]
            swp, iop = pct(pool(r["sw"], "total"), p), pct(pool(r["io"], "total"), p)
            rows[f"total_p{p}"] = (swp, iop, pct(pool(r["fio"], "write"), p) +
                                   pct(pool(r["fio"], "sync"), p), ratio(swp, iop),
                                   med([ratio(a, b) for a, b in zip(sw_r, io_r)]))
            for k in ("write", "sync"):
                sw_r = [pct(x[k], p) for x in r["sw"]]
                fi_r = [pct(x[k], p) for x in r["fio"]]
                swp, fip = pct(pool(r["sw"], k), p), pct(pool(r["fio"], k), p)
                rows[f"{k}_p{p}"] = (swp, float("nan"), fip, ratio(swp, fip),
                                     med([ratio(a, b) for a, b in zip(sw_r, fi_r)]))
        rows["gap"] = (med(r["gap"]), med(r["io_gap"]))
        if not paced:
            rows["ctl"] = tuple(pct(pool(r[k], "total"), 50) for k in ("ctl", "ctl_fstat"))
        rows["fio_counts"] = (r["fio"][0]["write_n"], r["fio"][0]["sync_n"])
        out["fs"][name] = rows
    return out


# ---------------------------------------------------------------------------------------
# 2 + 3. Overhead and scrape cost, against node_exporter, concurrently


def thread_cpu(pid):
    """CPU ns per thread name, from schedstat. Lane threads (p<target>-<mode>, comm
    truncated to 15 bytes) fold into lanes-<mode>; trailing digits into #."""
    out = {}
    for t in Path(f"/proc/{pid}/task").iterdir():
        try:
            st = (t / "stat").read_text()
            ns = int((t / "schedstat").read_text().split()[0])
        except OSError:
            continue
        name = st[st.index("(") + 1:st.rindex(")")]
        name = re.sub(r"^p\d+-", "lanes-", name) if re.match(r"^p\d+-", name) \
            else re.sub(r"\d+$", "#", name)
        out[name] = out.get(name, 0) + ns
    return out


def lane_cpu(threads):
    """Seconds of CPU of all probe lane threads."""
    return sum(v for k, v in threads.items() if k.startswith("lanes-"))


def curl_block(url, n, gzip):
    """n keep-alive GETs in one curl: (seconds to last byte less connect, bytes, encoding)."""
    cmd = ["curl", "-s", "-H", f"Accept-Encoding: {'gzip' if gzip else 'identity'}", "-w",
           "%{time_total} %{time_connect} %{size_download} %{http_code} %header{content-encoding}\\n"]
    for _ in range(n):
        cmd += ["-o", "/dev/null", url]
    r = run(cmd, timeout=120)
    out = []
    for ln in r.stdout.splitlines():
        f = ln.split()
        if len(f) < 4 or f[3] != "200":
            raise MeasureError(f"GET {url}: {ln!r}")
        out.append((float(f[0]) - float(f[1]), int(f[2]), f[4] if len(f) > 4 else ""))
    return out


def overhead_and_scrape(args, fss):
    cfg = ("listen_address: 127.0.0.1:0\ndefaults:\n  interval: 1s\n" + target_yaml(fss))
    agent = Agent(args.bin, args.work, "agent8", cfg)
    port = free_port()
    ne = start_proc([NODE_EXPORTER, f"--web.listen-address=127.0.0.1:{port}"],
                    args.work / "node_exporter.log", "node_exporter")
    nec = Client(f"127.0.0.1:{port}")
    deadline = time.monotonic() + 15
    while True:
        try:
            nec.get()
            break
        except (OSError, http.client.HTTPException, MeasureError):
            if time.monotonic() > deadline or ne.poll() is not None:
                raise SetupError(f"node_exporter did not start:\n"
                                 f"{(args.work / 'node_exporter.log').read_text()[-2000:]}")
            time.sleep(0.1)
    time.sleep(2)  # both past start-up: first probe cycles done, collectors initialised
    a0, n0, th0 = proc_stat(agent.proc.pid), proc_stat(ne.pid), thread_cpu(agent.proc.pid)
    t0 = time.monotonic()
    scrapes = 0
    log(f"overhead window: {args.window:.0f} s, agent {agent.addr} and node_exporter "
        f"127.0.0.1:{port} scraped every 15 s")
    text0 = None
    while True:
        t = agent.scrape()
        text0 = text0 or t
        nec.get()
        scrapes += 1
        nxt = t0 + 15 * scrapes
        if nxt >= t0 + args.window:
            break
        time.sleep(max(0, nxt - time.monotonic()))
    time.sleep(max(0, t0 + args.window - time.monotonic()))
    el = time.monotonic() - t0
    a1, n1, th1 = proc_stat(agent.proc.pid), proc_stat(ne.pid), thread_cpu(agent.proc.pid)
    text8 = agent.scrape()
    cycles = sum(sum(metric_values(text8, "stallwatch_probes_total", f.name)) -
                 sum(metric_values(text0, "stallwatch_probes_total", f.name)) for f in fss)
    errs = [ln for ln in samples(text8) if ln.startswith("stallwatch_probe_errors_total")]
    up = sum(metric_values(text8, "stallwatch_target_up", f.name)[0] for f in fss)
    over = {
        "window": el, "scrapes": scrapes, "cycles": cycles, "errors": errs, "up": up,
        "sw": {"cpu": a1[0] - a0[0], "rss": a1[1], "hwm": a1[2], "threads": a1[3]},
        "ne": {"cpu": n1[0] - n0[0], "rss": n1[1], "hwm": n1[2], "threads": n1[3]},
        "threads": {k: (v - th0.get(k, 0)) / 1e9 for k, v in th1.items()},
        "series8": len(samples(text8)),
    }

    # Scrape cost. curl (C, keep-alive) times each request to its last byte; the four
    # rows alternate in blocks of 25, with a pause at each switch so that one server's
    # after-work (Go's GC after a 90 KiB scrape) does not land in the other's timings
    # on this 2-CPU machine.
    log(f"scrape cost: {args.requests} keep-alive requests per server and encoding, "
        "interleaved in blocks of 25")
    urls = {"sw": f"http://{agent.addr}/metrics", "ne": f"http://127.0.0.1:{port}/metrics"}
    combos = [("sw", False), ("ne", False), ("sw", True), ("ne", True)]
    res = {c: [] for c in combos}
    c0 = {"sw": proc_stat(agent.proc.pid)[0], "ne": proc_stat(ne.pid)[0]}
    block = 25
    for i in range(-(-args.requests // block)):
        for c in combos[i % 4:] + combos[:i % 4]:
            time.sleep(0.1)
            got = curl_block(urls[c[0]], min(block, args.requests - i * block), c[1])
            if c[1] and any(e != "gzip" for _, _, e in got):
                raise MeasureError(f"{c[0]} did not gzip /metrics: {got[0]}")
            res[c] += got
    c1 = {"sw": proc_stat(agent.proc.pid), "ne": proc_stat(ne.pid)}
    scrape = {}
    for c in combos:
        t = [x[0] for x in res[c]]
        scrape[c] = {"p50": pct(t, 50), "p99": pct(t, 99), "max": max(t),
                     "bytes": med([x[1] for x in res[c]]), "n": len(t)}
    for k in ("sw", "ne"):
        scrape[k] = {"cpu_per_scrape": (c1[k][0] - c0[k]) / (2 * args.requests),
                     "hwm_after": c1[k][2]}
    nec.close()
    agent.stop()
    stop_proc(ne)
    return over, scrape


# ---------------------------------------------------------------------------------------
# 5. Series count


def series_count(args, fss):
    agent = Agent(args.bin, args.work, "agent4", "listen_address: 127.0.0.1:0\n" + target_yaml(fss))
    deadline = time.monotonic() + 15
    while True:
        text = agent.scrape()
        ups = [metric_values(text, "stallwatch_target_up", f.name) for f in fss]
        if all(u == [1.0] for u in ups):
            break
        if time.monotonic() > deadline:
            raise MeasureError(f"targets not up after 15 s: {ups}")
        time.sleep(0.2)
    time.sleep(1.5)  # one more VM-sampler pass (vm_interval 1 s) sees every target's device
    text = agent.scrape()
    agent.stop()
    lines = samples(text)
    per_target = {f.name: [ln for ln in lines if f'target="{f.name}"' in ln] for f in fss}
    device = [ln for ln in lines if "target=" not in ln and "device=" in ln]
    glob = [ln for ln in lines if "target=" not in ln and "device=" not in ln]
    fams = {}
    for ln in per_target[fss[0].name]:
        n = re.sub(r"_(bucket|sum|count)$", "", ln.split("{")[0])
        fams[n] = fams.get(n, 0) + 1
    return {"total": len(lines), "per_target": {k: len(v) for k, v in per_target.items()},
            "device": len(device), "devices": len({re.search(r'device="([^"]+)"', ln).group(1)
                                                   for ln in device}),
            "global": len(glob), "families": fams}


# ---------------------------------------------------------------------------------------
# 4. Detection delay under fsfreeze


class LineReader(threading.Thread):
    """Collects (monotonic time, line) from a pipe as lines arrive."""

    def __init__(self, pipe):
        super().__init__(daemon=True)
        self.pipe, self.lines = pipe, []

    def run(self):
        for ln in self.pipe:
            self.lines.append((time.monotonic(), ln.rstrip("\n")))


def detection(args, fs):
    thr, interval, hold = 1.0, 0.2, 2.0
    cfg = (f"listen_address: 127.0.0.1:0\nstall_threshold: {thr:g}s\ndefaults:\n"
           f"  interval: {int(interval * 1000)}ms\n" + target_yaml([fs]))
    agent = Agent(args.bin, args.work, "agent-freeze", cfg)
    # ioping next to it, as an operator would run it: one request every 200 ms.
    io = subprocess.Popen(["stdbuf", "-oL", "ioping", "-W", "-s", "4k", "-S", "4k", "-i", "200ms",
                           "-w", "60s", str(fs.mnt / "ioping")], stdout=subprocess.PIPE,
                          stderr=subprocess.DEVNULL, text=True, start_new_session=True)
    UNDO.push(f"stop ioping (pid {io.pid})", lambda: stop_proc(io))
    ior = LineReader(io.stdout)
    ior.start()
    time.sleep(1.5)
    trials = []
    for k in range(args.freezes):
        time.sleep(0.5 + random.uniform(0, interval))
        text = agent.scrape()
        base = sum(metric_values(text, "stallwatch_stalls_total", fs.name))
        if max(metric_values(text, "stallwatch_probe_inflight_seconds", fs.name)) > 0.1:
            log("note: a probe op was already slow before the freeze")
        t0 = time.monotonic()
        fz = subprocess.Popen(["sh", "-c", 'fsfreeze -f "$1" && echo frozen; sleep "$2"; '
                               'fsfreeze -u "$1"; echo thawed', "sh", str(fs.mnt), str(hold)],
                              stdout=subprocess.PIPE, text=True, start_new_session=True)
        UNDO.frozen.add(fs.mnt)  # the child thaws by itself too, even if we die
        UNDO.push(f"stop freezer (pid {fz.pid})", lambda fz=fz: stop_proc(fz))
        fzr = LineReader(fz.stdout)
        fzr.start()
        t_inflight = t_stall = None
        age_seen = None
        polls = 0
        while time.monotonic() - t0 < hold - 0.1 and (t_inflight is None or t_stall is None):
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
        try:
            fz.wait(hold + 30)
        finally:
            thaw(fs.mnt)
        fzr.join(2)
        t_frozen = next((t - t0 for t, ln in fzr.lines if ln == "frozen"), float("nan"))
        t_thawed = next((t - t0 for t, ln in fzr.lines if ln == "thawed"), float("nan"))
        time.sleep(0.5)
        trials.append({"inflight": t_inflight, "stall": t_stall, "age": age_seen,
                       "frozen": t_frozen, "thawed": t_thawed, "polls": polls, "t0": t0})
        log(f"freeze {k + 1}/{args.freezes}: in-flight at {t_inflight}, stall at {t_stall}")
    time.sleep(0.5)
    stall_events = json.loads(agent.client.get("/api/stalls")[0])
    agent.stop()
    stop_proc(io)
    # What ioping printed: for each freeze, its first line after the freeze began.
    for tr in trials:
        # Lines arriving in the first 0.3 s belong to requests issued before the freeze.
        after = [(t - tr["t0"], ln) for t, ln in ior.lines
                 if t >= tr["t0"] + 0.3 and "request=" in ln]
        tr["ioping"] = after[0] if after else None
    return {"threshold": thr, "interval": interval, "hold": hold, "trials": trials,
            "events": len(stall_events)}


# ---------------------------------------------------------------------------------------
# 6. Cost at scale: 64 targets (tmpfs mounts and the loop filesystems), against
#    node_exporter, at 1 s and 10 s; scrape cost, also while some targets are frozen.


class Tmpfs:
    """A small tmpfs mounted by the run under its work directory: a cheap target."""

    def __init__(self, work, idx):
        self.name = f"t{idx:02d}"
        self.mnt = work / "tmpfs" / self.name

    def create(self):
        self.mnt.mkdir(parents=True, exist_ok=True)
        UNDO.push(f"rmdir {self.mnt}", lambda: self.mnt.rmdir())
        run(["mount", "-t", "tmpfs", "-o", "size=8m,mode=0755", f"sw-bench-{self.name}",
             str(self.mnt)])
        UNDO.push(f"umount {self.mnt}", lambda: umount(self.mnt))
        return self


def start_node_exporter(work, tag):
    port = free_port()
    ne = start_proc([NODE_EXPORTER, f"--web.listen-address=127.0.0.1:{port}"],
                    work / f"node_exporter-{tag}.log", f"node_exporter {tag}")
    nec = Client(f"127.0.0.1:{port}")
    deadline = time.monotonic() + 15
    while True:
        try:
            nec.get()
            return ne, nec, port
        except (OSError, http.client.HTTPException, MeasureError):
            if time.monotonic() > deadline or ne.poll() is not None:
                raise SetupError(f"node_exporter did not start:\n"
                                 f"{(work / f'node_exporter-{tag}.log').read_text()[-2000:]}")
            time.sleep(0.1)


def wait_all_up(agent, targets, timeout):
    deadline = time.monotonic() + timeout
    while True:
        text = agent.scrape()
        down = [t.name for t in targets if metric_values(text, "stallwatch_target_up", t.name) != [1.0]]
        if not down:
            return text
        if time.monotonic() > deadline:
            raise MeasureError(f"targets not up after {timeout:.0f} s: {down[:8]} "
                               f"({len(down)} of {len(targets)})")
        time.sleep(0.25)


def scrape_blocks(urls, combos, requests, block=25):
    """requests GETs per (server, gzip) combo in keep-alive curl blocks that rotate
    through the combos, with a 100 ms pause at each switch (see section 3)."""
    res = {c: [] for c in combos}
    for i in range(-(-requests // block)):
        for c in combos[i % len(combos):] + combos[:i % len(combos)]:
            time.sleep(0.1)
            got = curl_block(urls[c[0]], min(block, requests - i * block), c[1])
            if c[1] and any(e != "gzip" for _, _, e in got):
                raise MeasureError(f"{c[0]} did not gzip /metrics: {got[0]}")
            res[c] += got
    out = {}
    for c in combos:
        t = [x[0] for x in res[c]]
        out[c] = {"p50": pct(t, 50), "p99": pct(t, 99), "max": max(t),
                  "bytes": med([x[1] for x in res[c]]), "n": len(t)}
    return out


def freezer(mnt, hold):
    """A child that freezes mnt, and thaws it itself after hold s even if we die."""
    fz = subprocess.Popen(["sh", "-c", 'fsfreeze -f "$1" && echo frozen; sleep "$2"; '
                           'fsfreeze -u "$1"; echo thawed', "sh", str(mnt), str(hold)],
                          stdout=subprocess.PIPE, text=True, start_new_session=True)
    UNDO.frozen.add(mnt)
    UNDO.push(f"stop freezer (pid {fz.pid})", lambda: stop_proc(fz))
    return fz


def get_timed(client, path, n):
    t = []
    for _ in range(n):
        t.append(client.get(path)[1])
    return t


def scale_phase(args, targets, loops, interval, with_scrape):
    """One agent probing every target at `interval`, next to node_exporter, for the
    scale window; then (with_scrape) the scrape cost and the scrape cost while
    args.scale_frozen of the loop targets are frozen."""
    iv = f"{interval:g}s"
    cfg = f"listen_address: 127.0.0.1:0\ndefaults:\n  interval: {iv}\n" + target_yaml(targets)
    agent = Agent(args.bin, args.work, f"agent{len(targets)}-{iv}", cfg)
    ne, nec, port = start_node_exporter(args.work, f"scale-{iv}")
    t_up = time.monotonic()
    # Lanes start staggered over the interval: every target is up after one interval.
    wait_all_up(agent, targets, 2 * interval + 15)
    log(f"scale {iv}: {len(targets)} targets up after {time.monotonic() - t_up:.1f} s")
    time.sleep(2)
    a0, n0, th0 = proc_stat(agent.proc.pid), proc_stat(ne.pid), thread_cpu(agent.proc.pid)
    text0 = agent.scrape()
    t0 = time.monotonic()
    scrapes = 1
    nec.get()
    log(f"scale {iv}: window {args.scale_window:.0f} s, agent {agent.addr}, node_exporter "
        f"127.0.0.1:{port}, both scraped every 15 s")
    while True:
        nxt = t0 + 15 * scrapes
        if nxt >= t0 + args.scale_window:
            break
        time.sleep(max(0, nxt - time.monotonic()))
        agent.scrape()
        nec.get()
        scrapes += 1
    time.sleep(max(0, t0 + args.scale_window - time.monotonic()))
    el = time.monotonic() - t0
    a1, n1, th1 = proc_stat(agent.proc.pid), proc_stat(ne.pid), thread_cpu(agent.proc.pid)
    text1 = agent.scrape()
    cycles = sum(sum(metric_values(text1, "stallwatch_probes_total", t.name)) -
                 sum(metric_values(text0, "stallwatch_probes_total", t.name)) for t in targets)
    skipped = sum(sum(metric_values(text1, "stallwatch_probes_skipped_total", t.name)) -
                  sum(metric_values(text0, "stallwatch_probes_skipped_total", t.name))
                  for t in targets)
    errs = [ln for ln in samples(text1) if ln.startswith("stallwatch_probe_errors_total")]
    up = sum(metric_values(text1, "stallwatch_target_up", t.name)[0] for t in targets)
    lines = samples(text1)
    per_target = [len([ln for ln in lines if f'target="{t.name}"' in ln]) for t in targets]
    out = {
        "interval": interval, "window": el, "scrapes": scrapes, "cycles": cycles,
        "skipped": skipped, "errors": errs, "up": up, "targets": len(targets),
        "lanes": len(targets) * 2,
        "sw": {"cpu": a1[0] - a0[0], "rss": a1[1], "hwm": a1[2], "threads": a1[3]},
        "ne": {"cpu": n1[0] - n0[0], "rss": n1[1], "hwm": n1[2], "threads": n1[3]},
        "threads": {k: (v - th0.get(k, 0)) / 1e9 for k, v in th1.items()},
        "series": len(lines), "per_target": (min(per_target), max(per_target)),
        "bytes": len(text1.encode()),
    }
    if with_scrape:
        urls = {"sw": f"http://{agent.addr}/metrics", "ne": f"http://127.0.0.1:{port}/metrics"}
        combos = [("sw", False), ("ne", False), ("sw", True), ("ne", True)]
        log(f"scale {iv}: scrape cost, {args.requests} requests per server and encoding")
        c0 = {"sw": proc_stat(agent.proc.pid)[0], "ne": proc_stat(ne.pid)[0]}
        out["scrape"] = scrape_blocks(urls, combos, args.requests)
        c1 = {"sw": proc_stat(agent.proc.pid), "ne": proc_stat(ne.pid)}
        for k in ("sw", "ne"):
            out["scrape"][k] = {"cpu_per_scrape": (c1[k][0] - c0[k]) / (2 * args.requests),
                                "hwm_after": c1[k][2]}
        out["frozen"] = scrape_while_frozen(args, agent, ne, urls, combos,
                                            loops[:args.scale_frozen])
        out["sw"]["hwm_end"] = proc_stat(agent.proc.pid)[2]
    nec.close()
    agent.stop()
    stop_proc(ne)
    return out


def scrape_while_frozen(args, agent, ne, urls, combos, frozen):
    """Freezes `frozen` (loop targets), waits until every lane of each is blocked past
    the stall threshold, then times scrapes of both servers, the landing page and
    /api/stalls; thaws in a finally."""
    hold = 60  # the children's own thaw, should the runner die; we thaw well before
    fzs = []
    res = {}
    try:
        for f in frozen:
            fzs.append(freezer(f.mnt, hold))
        t0 = time.monotonic()
        # Every lane of a frozen target enters its next cycle within one interval and
        # blocks in its first write-side call; wait until each is seen past 1 s.
        names = {f.name for f in frozen}
        while True:
            text = agent.scrape()
            blocked = {n: len([v for v in metric_values(text, "stallwatch_probe_inflight_seconds", n)
                               if v >= 1.0]) for n in names}
            if all(b >= 2 for b in blocked.values()):
                break
            if time.monotonic() - t0 > 10:
                raise MeasureError(f"frozen targets' lanes not all blocked after 10 s: {blocked}")
            time.sleep(0.1)
        log(f"frozen {sorted(names)}: every lane blocked after {time.monotonic() - t0:.1f} s; "
            f"scrape cost while frozen, {args.frozen_requests} requests per server and encoding")
        res = scrape_blocks(urls, combos, args.frozen_requests)
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
    finally:
        for f in frozen:
            thaw(f.mnt)
        for fz in fzs:
            stop_proc(fz)
    # After the thaw: every lane's blocked call returns and its stall is closed.
    deadline = time.monotonic() + 10
    while True:
        ev = json.loads(agent.client.get("/api/stalls")[0])
        mine = [e for e in ev if e["target"] in res["names"]]
        if mine and not any(e["ongoing"] for e in mine):
            break
        if time.monotonic() > deadline:
            break
        time.sleep(0.2)
    res["events"] = len(mine)
    res["events_naming_other"] = len([e for e in mine if e["also_blocked"]])
    return res


def scale(args, loops):
    n_tmpfs = args.scale_targets - len(loops)
    log(f"scale: mounting {n_tmpfs} tmpfs under {args.work / 'tmpfs'}")
    tmp = [Tmpfs(args.work, i).create() for i in range(n_tmpfs)]
    targets = loops + tmp
    out = {"n_tmpfs": n_tmpfs, "n_loop": len(loops)}
    out["1s"] = scale_phase(args, targets, loops, 1.0, with_scrape=True)
    out["10s"] = scale_phase(args, targets, loops, 10.0, with_scrape=False)
    return out


# ---------------------------------------------------------------------------------------
# 7. Accuracy of append against fio's etcd job


APPEND_BS = 2300  # etcd's guidance: fio --rw=write --ioengine=sync --fdatasync=1 --bs=2300


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
    r = run(cmd, timeout=180)
    job = json.loads(r.stdout[r.stdout.index("{"):])["jobs"][0]
    clat = [int(ln.split(",")[1]) / 1e9 for ln in open(f"{prefix}_clat.1.log") if ln.strip()]
    for f in logdir.glob(f"{tag}_*.log"):
        f.unlink()
    for f in d.iterdir():
        f.unlink()
    sync = [int(v) / 1e9 for v, c in job["sync"]["lat_ns"]["bins"].items() for _ in range(c)]
    return {"write": clat, "sync": sync, "write_n": job["write"]["total_ios"],
            "sync_n": job["sync"]["lat_ns"]["N"]}


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
        calls = []
        for name, f, rest, ret in found:
            if f != fd:
                continue
            if name == "fallocate":
                mode, off, length = [x.strip() for x in rest.lstrip(", ").split(",")]
                calls.append(f"fallocate(mode {mode}, offset {off}, length {length})")
            elif name == "write":
                calls.append(f"write {ret}")
            else:
                calls.append(name + rest)
        for f in d.iterdir():
            f.unlink()
        out[label] = calls
    return out


APPEND_TOOLS = ["sw", "fio", "fio_grow", "ctl_open", "ctl_reopen"]


def run_append_tool(args, fs, tool, n, paced, tag):
    """One run of `tool` (one of APPEND_TOOLS) on `fs`; `tag` names fio's latency log."""
    if tool == "sw":
        return run_stallwatch_append(args.bin, fs, n, paced)
    if tool.startswith("ctl"):
        return run_append_control(fs, n, paced, keep_open=(tool == "ctl_open"))
    return run_fio_append(fs, n, args.work, tag, paced, prealloc=(tool == "fio"))


def append_warmup(args, fss, n):
    """One unmeasured back-to-back run of every tool on every filesystem before the
    measured rounds. On a new filesystem the first runs of every tool are slower, and
    `stallwatch probe` makes a new .stallwatch directory per run, which XFS (inode64)
    places in the next allocation group: on the 4-AG XFS it runs four times, once per
    allocation group (BENCHMARKS.md, runs 16-19)."""
    for fs in fss:
        for t in APPEND_TOOLS:
            for _ in range(4 if t == "sw" and fs.kind == "xfs" else 1):
                run_append_tool(args, fs, t, n, False, f"warm-{fs.name}-{t}")
    log(f"append accuracy: warm-up done ({n} requests per tool and filesystem, not counted)")


def append_accuracy(args, fss, paced, rounds, n):
    tools = APPEND_TOOLS
    res = {f.name: {t: [] for t in tools} for f in fss}
    label = f"paced {PACE_MS} ms" if paced else "back-to-back"
    p0, t0 = io_pressure(), time.monotonic()
    for rnd in range(rounds):
        order = tools[rnd % len(tools):] + tools[:rnd % len(tools)]
        for fs in (fss if rnd % 2 == 0 else fss[::-1]):
            r = res[fs.name]
            for t in order:
                r[t].append(run_append_tool(args, fs, t, n, paced, f"ap-{fs.name}-{int(paced)}-{rnd}-{t}"))
        log(f"append accuracy {label} round {rnd + 1}/{rounds}: " + "; ".join(
            f"{nm} fdatasync p50/p99 stallwatch {us(pct(r['sw'][-1]['sync'], 50))}/"
            f"{us(pct(r['sw'][-1]['sync'], 99))} fio {us(pct(r['fio'][-1]['sync'], 50))}/"
            f"{us(pct(r['fio'][-1]['sync'], 99))} fio grow {us(pct(r['fio_grow'][-1]['sync'], 50))}/"
            f"{us(pct(r['fio_grow'][-1]['sync'], 99))}" for nm, r in res.items()))
    p1, t1 = io_pressure(), time.monotonic()
    pool = lambda runs, k: [x for run_ in runs for x in run_[k]]  # noqa: E731
    # write+fdatasync as the sum of the two ops' percentiles, the one estimator both
    # tools give (fio logs no per-request sync latency); stallwatch's per-cycle
    # percentile of the sum is printed beside it.
    both = lambda x, p: pct(x["write"], p) + pct(x["sync"], p)  # noqa: E731
    out = {"label": label, "rounds": rounds, "n": n, "paced": paced, "warmup": args.append_warmup,
           "pressure": (p1 - p0) / (t1 - t0) if p0 is not None else None, "fs": {}}
    for name, r in res.items():
        rows = {}
        for ref in ("fio", "fio_grow"):
            for p in (50, 99):
                sw_r = [both(x, p) for x in r["sw"]]
                fi_r = [both(x, p) for x in r[ref]]
                swp = pct(pool(r["sw"], "write"), p) + pct(pool(r["sw"], "sync"), p)
                fip = pct(pool(r[ref], "write"), p) + pct(pool(r[ref], "sync"), p)
                rows[(ref, "total", p)] = (swp, fip, ratio(swp, fip),
                                           med([ratio(a, b) for a, b in zip(sw_r, fi_r)]))
                for k in ("write", "sync"):
                    sw_r = [pct(x[k], p) for x in r["sw"]]
                    fi_r = [pct(x[k], p) for x in r[ref]]
                    swp, fip = pct(pool(r["sw"], k), p), pct(pool(r[ref], k), p)
                    rows[(ref, k, p)] = (swp, fip, ratio(swp, fip),
                                         med([ratio(a, b) for a, b in zip(sw_r, fi_r)]))
        rows["sw_cycle"] = {p: pct(pool(r["sw"], "total"), p) for p in (50, 99)}
        # The controls: the percentile of the per-request sum (pooled), and stallwatch's
        # median round ratio to each on the same estimator as against fio.
        for c in ("ctl_open", "ctl_reopen"):
            rows[c] = {p: (pct(pool(r[c], "total"), p),
                           med([ratio(both(a, p), both(b, p)) for a, b in zip(r["sw"], r[c])]))
                       for p in (50, 99)}
        rows["fio_counts"] = {t: (r[t][0]["write_n"], r[t][0]["sync_n"]) for t in ("fio", "fio_grow")}
        out["fs"][name] = rows
    return out


# ---------------------------------------------------------------------------------------
# Report


def machine():
    cpu = re.search(r"^model name\s*:\s*(.*)$", Path("/proc/cpuinfo").read_text(), re.M)
    mem = re.search(r"^MemTotal:\s*(\d+)", Path("/proc/meminfo").read_text(), re.M)
    virt = run(["systemd-detect-virt"], check=False).stdout.strip() if shutil.which(
        "systemd-detect-virt") else "?"
    return {
        "nproc": os.cpu_count(), "cpu": cpu.group(1) if cpu else "?",
        "kernel": os.uname().release, "mem_gib": int(mem.group(1)) / 2**20 if mem else 0,
        "virt": virt,
    }


def versions(binary, work):
    v = {}
    for name, cmd in (("stallwatch", [str(binary), "--version"]), ("fio", ["fio", "--version"]),
                      ("ioping", ["ioping", "-v"]),
                      ("node_exporter", [NODE_EXPORTER, "--version"]),
                      ("mkfs.xfs", ["mkfs.xfs", "-V"]), ("mke2fs", ["mke2fs", "-V"])):
        r = run(cmd, check=False, cwd=work)
        v[name] = (r.stdout + r.stderr).strip().splitlines()[0] if (r.stdout + r.stderr).strip() else "?"
    return v


def binary_identity(src, copy):
    h = hashlib.sha256(copy.read_bytes()).hexdigest()[:12]
    mtime = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(src.stat().st_mtime))
    git = run(["git", "-C", str(REPO), "rev-parse", "--short", "HEAD"], check=False).stdout.strip()
    dirty = run(["git", "-C", str(REPO), "status", "--porcelain", "--", "src", "Cargo.toml",
                 "Cargo.lock"], check=False).stdout.strip()
    newest = max(f.stat().st_mtime for f in [*(REPO / "src").rglob("*.rs"), REPO / "Cargo.toml"])
    stale = newest > src.stat().st_mtime
    return (f"{src} built {mtime}, sha256 {h}; HEAD {git or '?'}"
            f"{', uncommitted changes in src/' if dirty else ''}; "
            + ("OLDER than the newest source file: run cargo build --release" if stale
               else "newer than every source file"))


def table(rows, head):
    w = [max(len(str(x)) for x in col) for col in zip(head, *rows)]
    fmt = lambda r: "  ".join(str(x).ljust(w[i]) if i == 0 else str(x).rjust(w[i])  # noqa: E731
                              for i, x in enumerate(r))
    print(fmt(head))
    print("  ".join("-" * x for x in w))
    for r in rows:
        print(fmt(r))


def print_scrape(sc):
    """The scrape-cost table of section 3 and 6b: stallwatch beside node_exporter, plain
    and gzip, their p99 ratios, server CPU per scrape and peak RSS."""
    rows = []
    for (k, gz), name in ((("sw", False), "stallwatch"), (("ne", False), "node_exporter"),
                          (("sw", True), "stallwatch gzip"), (("ne", True), "node_exporter gzip")):
        x = sc[(k, gz)]
        rows.append((name, ms(x["p50"]), ms(x["p99"]), ms(x["max"]), f"{x['bytes']:.0f}"))
    table(rows, ("server", "p50", "p99", "max", "bytes"))
    for gz, lab in ((False, "plain"), (True, "gzip")):
        print(f"   p99 ratio stallwatch/node_exporter ({lab}): "
              f"{ratio(sc[('sw', gz)]['p99'], sc[('ne', gz)]['p99']):.3f}")
    print(f"   server CPU per scrape (mean over the burst): stallwatch "
          f"{sc['sw']['cpu_per_scrape'] * 1e3:.2f} ms, node_exporter {sc['ne']['cpu_per_scrape'] * 1e3:.2f} ms; peak RSS after the burst: "
          f"stallwatch {sc['sw']['hwm_after'] / 1024:.1f} MiB, node_exporter "
          f"{sc['ne']['hwm_after'] / 1024:.1f} MiB")


def report(args, mach, vers, build, backing, accs, mix, over, scrape, det, ser, scl, aaccs, amix,
           goals):
    print()
    print("stallwatch benchmark")
    print(f"machine: {mach['nproc']} CPUs, {mach['cpu']}, {mach['mem_gib']:.1f} GiB, kernel "
          f"{mach['kernel']}, virtualisation: {mach['virt']}")
    print(f"loop images: sparse 320 MiB files on {backing} (buffered loop, no direct I/O)")
    print("versions: " + "; ".join(f"{k} {v}" for k, v in vers.items()))
    print(f"binary: {build}")
    print(f"command: {' '.join(sys.argv)}")

    for acc in accs or []:
        paced = acc["paced"]
        print(f"\n1{'a' if paced else 'b'}. Accuracy, {acc['label']}: 4 KiB pwrite at offset 0 + "
              f"fdatasync, {acc['n']} requests per run, {acc['rounds']} interleaved rounds per "
              "filesystem; percentiles of the pooled samples of all rounds; ratio: of the pooled "
              "percentiles, and the median of the per-round ratios"
              + (f"; host I/O pressure (PSI some) {100 * acc['pressure']:.1f}% of the time"
                 if acc["pressure"] is not None else ""))
        if paced:
            print(f"    requests {PACE_MS} ms apart: stallwatch --interval {PACE_MS}ms, ioping -i "
                  f"{PACE_MS}ms, fio --rate_iops={1000 // PACE_MS}")
        else:
            print("    requests back to back: stallwatch --interval 0, ioping -i 0, fio unpaced")
        rows = []
        for fs, r in acc["fs"].items():
            for key, label, cmp_ in (("total_p50", "write+fdatasync p50", "ioping"),
                                     ("total_p99", "write+fdatasync p99", "ioping"),
                                     ("write_p50", "write p50", "fio"),
                                     ("write_p99", "write p99", "fio"),
                                     ("sync_p50", "fdatasync p50", "fio"),
                                     ("sync_p99", "fdatasync p99", "fio")):
                sw, io, fi, rt, rm = r[key]
                fio_s = ("≈" + us(fi)) if key.startswith("total") else us(fi)
                rows.append((fs, label, us(sw), us(io), fio_s, cmp_, f"{rt:.3f}", f"{rm:.3f}"))
        table(rows, ("fs", "latency", "stallwatch", "ioping", "fio", "ref", "stallwatch/ref",
                     "median round ratio"))
        print("   fio ≈: fio times the pwrite (clat log) and the fdatasync (sync percentiles) "
              "separately; ≈ is the sum of the two percentiles, for scale only.")
        if not paced:
            print("   control (in-process, fd kept open, 4 KiB pwrite+fdatasync back to back), "
                  "pooled p50: " + "; ".join(
                      f"{fs}: plain {us(r['ctl'][0])}, with an fstat before each request "
                      f"{us(r['ctl'][1])} ({r['ctl'][1] / r['ctl'][0]:.2f}x)"
                      for fs, r in acc["fs"].items()))
        for fs, r in acc["fs"].items():
            if not paced:
                print(f"   {fs}: time per cycle outside the timed calls: stallwatch "
                      f"{us(r['gap'][0])} (openat+statx+close of the probe file, thread hand-off), "
                      f"ioping {us(r['gap'][1])} per request")
            print(f"   {fs}: fio timed {r['fio_counts'][0]} writes and {r['fio_counts'][1]} syncs "
                  "per run")
    if mix:
        print("   fio syscall mix (strace -f -c, 50 requests): " + "; ".join(
            f"{k}: " + ", ".join(f"{n}={c}" for n, c in v.items()) for k, v in mix.items()))

    if over:
        win = over["window"]
        print(f"\n2. Overhead over {win:.0f} s, both running concurrently, each scraped every 15 s "
              f"({over['scrapes']} scrapes); agent: 8 loop targets (4 XFS, 4 ext4), interval 1 s, "
              f"default modes (create, overwrite+fsync); {over['cycles']:.0f} mode cycles in the window, "
              f"{over['up']:.0f}/8 targets up, {len(over['errors'])} error series")
        rows = []
        for k, name in (("sw", "stallwatch"), ("ne", "node_exporter")):
            o = over[k]
            rows.append((name, f"{o['cpu']:.2f} s", f"{100 * o['cpu'] / win:.3f} %",
                         f"{o['hwm'] / 1024:.1f} MiB", f"{o['rss'] / 1024:.1f} MiB", o["threads"]))
        table(rows, ("process", "CPU (utime+stime)", "of one core", "peak RSS (VmHWM)",
                     "RSS at end", "threads"))
        print(f"   ratio stallwatch/node_exporter: CPU {ratio(over['sw']['cpu'], over['ne']['cpu']):.3f}, "
              f"peak RSS {ratio(over['sw']['hwm'], over['ne']['hwm']):.3f}")
        print("   stallwatch CPU by thread (schedstat): " + ", ".join(
            f"{k} {v * 1e3:.0f} ms" for k, v in sorted(over["threads"].items(), key=lambda x: -x[1]))
            + f"; probe threads per target cycle: "
              f"{us(lane_cpu(over['threads']) / max(1, over['cycles'] / 2))}")

    if scrape:
        print(f"\n3. Scrape cost: GET /metrics with 8 targets, {args.requests} sequential keep-alive "
              "requests per row, rows alternating in blocks of 25; curl's time to the last byte "
              "(connect excluded); bytes as sent")
        print_scrape(scrape)

    if det:
        print(f"\n4. Detection delay: fsfreeze -f of an XFS loop target for {det['hold']:g} s, "
              f"threshold {det['threshold']:g} s, interval {det['interval'] * 1000:.0f} ms, /metrics "
              "polled every 20 ms; times from the start of fsfreeze (reply time of the first poll "
              "that shows it)")
        rows = []
        for i, t in enumerate(det["trials"], 1):
            io = t["ioping"]
            iot = f"+{io[0]:.2f} s: {io[1].split(': ', 1)[-1]}" if io else "none"
            rows.append((i, ms(t["frozen"]), ms(t["inflight"]) if t["inflight"] is not None else "never",
                         ms(t["stall"]) if t["stall"] is not None else "never",
                         ms(t["thawed"]), iot))
        table(rows, ("freeze", "fs frozen", "in-flight > 0", "stall counted", "thawed",
                     "ioping's first line after the freeze"))
        print(f"   median: in-flight {ms(med([t['inflight'] or float('nan') for t in det['trials']]))}, "
              f"stall counted {ms(med([t['stall'] or float('nan') for t in det['trials']]))}; "
              f"/api/stalls events: {det['events']}")

    if ser:
        print("\n5. Series (sample lines of a real scrape, defaults: modes create+overwrite, fsync)")
        pt = list(ser["per_target"].values())
        rows = [("per target (target label)", "/".join(map(str, pt))),
                ("per block device (device label)", f"{ser['device'] / max(1, ser['devices']):.0f}"),
                ("global (vm, sysctl, psi, process, build)", ser["global"]),
                ("total, 4 targets", ser["total"])]
        if over:
            rows.append(("total, 8 targets (overhead run)", over["series8"]))
        table(rows, ("series", "count"))
        print("   per target by family: " + ", ".join(f"{k.replace('stallwatch_', '')} {v}"
                                                       for k, v in ser["families"].items()))

    if scl:
        report_scale(args, scl)
    for acc in aaccs or []:
        report_append(acc, amix)

    print("\nGoals")
    if goals:
        table([(g, m, "ok" if ok else "MISSED") for g, m, ok in goals], ("goal", "measured", ""))
    else:
        print("(none in the selected sections)")


def report_scale(args, scl):
    one, ten = scl["1s"], scl["10s"]
    print(f"\n6. Cost at scale: {one['targets']} targets ({scl['n_loop']} loop filesystems, 4 XFS + "
          f"4 ext4, and {scl['n_tmpfs']} tmpfs of 8 MiB), default modes (create, overwrite+fsync): "
          f"{one['lanes']} lanes; next to node_exporter (default collectors, same host, same "
          "mounts), both scraped every 15 s; CPU is utime+stime of the process over the window")
    rows = []
    for ph in (one, ten):
        for k, name in (("sw", "stallwatch"), ("ne", "node_exporter")):
            o = ph[k]
            rows.append((f"{ph['interval']:g} s", name, f"{ph['window']:.0f} s", f"{o['cpu']:.2f} s",
                         f"{100 * o['cpu'] / ph['window']:.3f} %", f"{o['hwm'] / 1024:.1f} MiB",
                         f"{o['rss'] / 1024:.1f} MiB", o["threads"]))
    table(rows, ("interval", "process", "window", "CPU", "of one core", "peak RSS (VmHWM)",
                 "RSS at end", "threads"))
    for ph in (one, ten):
        lanes_s = lane_cpu(ph["threads"])
        print(f"   {ph['interval']:g} s: {ph['cycles']:.0f} lane cycles in the window "
              f"({ph['cycles'] / ph['window']:.1f}/s), {ph['skipped']:.0f} skipped, "
              f"{ph['up']:.0f}/{ph['targets']} targets up, {len(ph['errors'])} error series; "
              f"stallwatch CPU by thread: lanes {lanes_s * 1e3:.0f} ms "
              f"({us(lanes_s / max(1, ph['cycles']))} per lane cycle), " + ", ".join(
                  f"{k} {v * 1e3:.0f} ms" for k, v in sorted(ph["threads"].items(), key=lambda x: -x[1])
                  if not k.startswith("lanes-")))
    print(f"   series: {one['series']} sample lines in a scrape with {one['targets']} targets "
          f"({one['per_target'][0]}-{one['per_target'][1]} per target), {one['bytes']} bytes plain")
    sc = one["scrape"]
    print(f"\n6b. Scrape cost with {one['targets']} targets at 1 s: GET /metrics, {args.requests} "
          "keep-alive requests per row, rows alternating in blocks of 25 (as in 3)")
    print_scrape(sc)
    fr = one["frozen"]
    print(f"\n6c. Scrape cost while {len(fr['names'])} of the {one['targets']} targets are frozen "
          f"({', '.join(fr['names'])}: fsfreeze -f, every lane of each blocked past 1 s before "
          f"the first request; {fr['blocked_lanes']} lanes in flight at the end, blocked "
          f"{fr['age_min']:.1f}-{fr['age_max']:.1f} s), {args.frozen_requests} requests per row "
          "in blocks of 25")
    rows = []
    for (k, gz), name in ((("sw", False), "stallwatch"), (("ne", False), "node_exporter"),
                          (("sw", True), "stallwatch gzip"), (("ne", True), "node_exporter gzip")):
        x, y = fr[(k, gz)], sc[(k, gz)]
        rows.append((name, ms(x["p50"]), ms(x["p99"]), ms(x["max"]), ms(y["p99"]),
                     f"{ratio(x['p99'], y['p99']):.3f}"))
    table(rows, ("server", "p50 frozen", "p99 frozen", "max frozen", "p99 not frozen (6b)",
                 "frozen/not"))
    print(f"   landing page (50 GETs while frozen): p50 {ms(pct(fr['page'], 50))}, max "
          f"{ms(max(fr['page']))}, lists {fr['page_lists']} of {2 * len(fr['names'])} blocked lanes; "
          f"/api/stalls: p50 {ms(pct(fr['api'], 50))}, max {ms(max(fr['api']))}, "
          f"{fr['ongoing']} ongoing events; after the thaw {fr['events']} events of the frozen "
          f"targets, {fr['events_naming_other']} naming another lane blocked with it")


def report_append(acc, amix):
    print(f"\n7{'a' if acc['paced'] else 'b'}. Accuracy of append, {acc['label']}: write of "
          f"{APPEND_BS} bytes at the end of a new log file + fdatasync, {acc['n']} requests per run, "
          f"{acc['rounds']} interleaved rounds per filesystem"
          + (" after an unmeasured warm-up run of each tool (stallwatch 4 on XFS)" if acc["warmup"]
             else ", no warm-up")
          + f"; stallwatch probe --mode append "
          f"--size {APPEND_BS} against fio's etcd job (--rw=write --ioengine=sync --fdatasync=1 "
          f"--bs={APPEND_BS}) as published and with --fallocate=none"
          + (f"; host I/O pressure (PSI some) {100 * acc['pressure']:.1f}% of the time"
             if acc["pressure"] is not None else ""))
    if acc["paced"]:
        print(f"    requests {PACE_MS} ms apart: stallwatch --interval {PACE_MS}ms, fio "
              f"--rate_iops={1000 // PACE_MS}")
    else:
        print("    requests back to back: stallwatch --interval 0, fio unpaced (as etcd's job)")
    rows = []
    for fs, r in acc["fs"].items():
        for k, lab in (("total", "write+fdatasync"), ("write", "write"), ("sync", "fdatasync")):
            for p in (50, 99):
                a, b = r[("fio", k, p)], r[("fio_grow", k, p)]
                rows.append((fs, f"{lab} p{p}", us(a[0]), us(a[1]), f"{a[2]:.3f}", f"{a[3]:.3f}",
                             us(b[1]), f"{b[2]:.3f}", f"{b[3]:.3f}"))
    table(rows, ("fs", "latency", "stallwatch", "fio etcd", "ratio", "median round",
                 "fio fallocate=none", "ratio", "median round"))
    print("   write+fdatasync: the sum of the write and the fdatasync percentile, for both tools "
          "(fio logs no per-request sync time); ratio: of the pooled percentiles; median round: "
          "of the per-round ratios")
    for fs, r in acc["fs"].items():
        c = r["fio_counts"]
        print(f"   {fs}: stallwatch's percentile of the per-cycle sum: p50 {us(r['sw_cycle'][50])}, "
              f"p99 {us(r['sw_cycle'][99])}; fio timed {c['fio'][0]} writes and {c['fio'][1]} "
              f"syncs per run (fallocate=none: {c['fio_grow'][0]} / {c['fio_grow'][1]})")
    for fs, r in acc["fs"].items():
        print(f"   {fs}: control in-process (Python), write+fdatasync per request, pooled p50 / p99, "
              "and stallwatch's median round ratio to it: descriptor kept open "
              f"{us(r['ctl_open'][50][0])} / {us(r['ctl_open'][99][0])} (ratio {r['ctl_open'][50][1]:.3f} / "
              f"{r['ctl_open'][99][1]:.3f}); opened and closed around each request "
              f"{us(r['ctl_reopen'][50][0])} / {us(r['ctl_reopen'][99][0])} (ratio "
              f"{r['ctl_reopen'][50][1]:.3f} / {r['ctl_reopen'][99][1]:.3f})")
    if amix and acc["paced"]:
        for k, v in amix.items():
            print(f"   fio {k}, strace of a 4-write run, calls on the file: " + ", ".join(v))


def goals_of(accs, over, scrape, det, scl=None, aaccs=None):
    g = []
    acc = next((a["fs"] for a in accs or [] if a["paced"]), {})
    for fs, r in acc.items():
        # Judged on the median of the per-round ratios: each round pairs runs seconds
        # apart, and the median drops rounds in which a burst of foreign I/O hit one tool.
        g.append((f"{fs}: p50 within 10% of ioping (paced, median round ratio)",
                  f"{r['total_p50'][4]:.3f}", abs(r["total_p50"][4] - 1) <= 0.10))
        g.append((f"{fs}: p99 within 25% of ioping (paced, median round ratio)",
                  f"{r['total_p99'][4]:.3f}", abs(r["total_p99"][4] - 1) <= 0.25))
    if over:
        c = 100 * over["sw"]["cpu"] / over["window"]
        g.append(("CPU <= 0.2% of one core (8 targets, 1 s)", f"{c:.3f} %", c <= 0.2))
        g.append(("peak RSS <= 10 MiB", f"{over['sw']['hwm'] / 1024:.1f} MiB",
                  over["sw"]["hwm"] <= 10 * 1024))
    if scrape:
        for gz, lab in ((False, ""), (True, " (gzip)")):
            p = scrape[("sw", gz)]["p99"]
            g.append((f"scrape p99 < 2 ms{lab}", ms(p), p < 0.002))
            rt = ratio(p, scrape[("ne", gz)]["p99"])
            g.append((f"scrape p99 < 1/5 of node_exporter's{lab}", f"{rt:.3f}", rt < 0.2))
    if det:
        lim = det["threshold"] + 0.3
        for key, lab in (("inflight", "in-flight age visible"), ("stall", "stall counted")):
            worst = max((t[key] if t[key] is not None else float("inf")) for t in det["trials"])
            g.append((f"{lab} within threshold+0.3 s (worst of {len(det['trials'])})",
                      ms(worst) if worst != float("inf") else "never", worst <= lim))
    if scl:
        one, ten = scl["1s"], scl["10s"]
        n = one["targets"]
        c = 100 * one["sw"]["cpu"] / one["window"]
        g.append((f"CPU <= 1% of one core ({n} targets, 1 s)", f"{c:.3f} %", c <= 1.0))
        hwm = max(one["sw"]["hwm"], one["sw"]["hwm_end"], ten["sw"]["hwm"])
        g.append((f"peak RSS <= 24 MiB ({n} targets, all phases)", f"{hwm / 1024:.1f} MiB",
                  hwm <= 24 * 1024))
        for key, lab in (("scrape", ""), ("frozen", f", {len(one['frozen']['names'])} frozen")):
            for gz, glab in ((False, ""), (True, " gzip")):
                p = one[key][("sw", gz)]["p99"]
                q = one[key][("ne", gz)]["p99"]
                g.append((f"scrape p99 <= 5 ms ({n} targets{lab}{glab})", ms(p), p <= 0.005))
                g.append((f"scrape p99 < node_exporter's ({n} targets{lab}{glab})",
                          f"{ratio(p, q):.3f}", p < q))
    for acc in aaccs or []:
        for fs, r in acc["fs"].items():
            for p in (50, 99):
                rm = r[("fio", "total", p)][3]
                g.append((f"{fs}: append p{p} / fio etcd within 0.8-1.25 ({acc['label']}, median "
                          "round ratio)", f"{rm:.3f}", 0.8 <= rm <= 1.25))
    return g


# ---------------------------------------------------------------------------------------


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--bin", type=Path, default=REPO / "target" / "release" / "stallwatch")
    ap.add_argument("--quick", action="store_true", help="smoke run: short windows, few rounds")
    ap.add_argument("--rounds", type=int, default=12, help="paced accuracy rounds (default 12)")
    ap.add_argument("--count", type=int, default=200, help="requests per paced run (default 200)")
    ap.add_argument("--b2b-rounds", type=int, default=3, help="back-to-back rounds (default 3)")
    ap.add_argument("--b2b-count", type=int, default=1000, help="requests per back-to-back run")
    ap.add_argument("--window", type=float, default=120, help="overhead window, s (default 120)")
    ap.add_argument("--requests", type=int, default=500, help="scrape requests per row (default 500)")
    ap.add_argument("--freezes", type=int, default=3, help="fsfreeze trials (default 3)")
    ap.add_argument("--only", default="1,2,3,4,5",
                    help="sections to run, e.g. 1,4; 6 (64 targets) and 7 (append against fio) "
                         "run only when named: --only 6,7")
    ap.add_argument("--scale-targets", type=int, default=64,
                    help="targets of section 6: the 8 loop filesystems and tmpfs mounts (default 64)")
    ap.add_argument("--scale-window", type=float, default=90,
                    help="section 6 overhead window per interval, s (default 90)")
    ap.add_argument("--scale-frozen", type=int, default=4,
                    help="loop targets frozen during section 6's frozen scrapes (default 4)")
    ap.add_argument("--frozen-requests", type=int, default=200,
                    help="scrape requests per row while frozen (default 200)")
    ap.add_argument("--append-rounds", type=int, default=12, help="paced append rounds (default 12)")
    ap.add_argument("--append-count", type=int, default=400,
                    help="requests per paced append run (default 400)")
    ap.add_argument("--append-b2b-rounds", type=int, default=12,
                    help="back-to-back append rounds (default 12)")
    ap.add_argument("--append-b2b-count", type=int, default=3000,
                    help="requests per back-to-back append run (default 3000)")
    ap.add_argument("--append-warmup", type=int, choices=(0, 1), default=1,
                    help="1 (default): one unmeasured back-to-back run of every tool on both "
                         "filesystems before section 7's rounds; 0: none")
    ap.add_argument("--strict", action="store_true", help="exit 1 when a goal is missed")
    args = ap.parse_args()
    if args.quick:
        args.rounds, args.count, args.window, args.requests, args.freezes = 2, 100, 20, 100, 1
        args.b2b_rounds, args.b2b_count = 1, 300
        args.scale_window, args.frozen_requests = 20, 50
        args.append_rounds, args.append_count, args.append_b2b_rounds = 2, 100, 1
        args.append_b2b_count = 300
    if not 8 + 1 <= args.scale_targets <= 1000 or not 1 <= args.scale_frozen <= 8:
        ap.error("--scale-targets: 9 to 1000 (8 are loop filesystems); --scale-frozen: 1 to 8")
    only = set(args.only.split(","))
    if "2" in only or "3" in only:
        only |= {"2", "3"}  # one run measures both

    signal.signal(signal.SIGINT, on_signal)  # also when started with SIGINT ignored (nohup, &)
    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGHUP, on_signal)
    try:
        if os.geteuid() != 0:
            raise SetupError("run as root (loop devices, mount, fsfreeze)")
        for tool in ("fio", "ioping", "strace", "curl", "stdbuf", "mkfs.xfs", "mkfs.ext4",
                     "losetup", "fsfreeze", "truncate", "findmnt", NODE_EXPORTER):
            if not shutil.which(tool):
                raise SetupError(f"{tool} not found")
        if not os.access(args.bin, os.X_OK):
            raise SetupError(f"{args.bin} missing: run cargo build --release first")
        args.work = Path(tempfile.mkdtemp(prefix="stallwatch-bench.", dir="/var/tmp"))
        UNDO.push(f"rm -r {args.work}", lambda: shutil.rmtree(args.work, ignore_errors=True))
        # A private copy: the shared target directory may be rebuilt during the run.
        src_bin, args.bin = args.bin, args.work / "stallwatch"
        shutil.copy2(src_bin, args.bin)
        build = binary_identity(src_bin, args.bin)
        mach = machine()
        vers = versions(args.bin, args.work)
        backing = run(["findmnt", "-n", "-o", "SOURCE,FSTYPE", "-T", str(args.work)],
                      check=False).stdout.strip() or "?"
        started = time.monotonic()
        log(f"work directory {args.work}; creating 8 loop filesystems")
        try:
            fss = [Fs(args.work, k, i).create() for i in range(4) for k in ("xfs", "ext4")]
        except MeasureError as e:
            raise SetupError(f"cannot create loop filesystems: {e}") from e
        xfs0, ext0 = fss[0], fss[1]
        accs = mix = over = scrape = det = ser = scl = aaccs = amix = None
        if "1" in only:
            mix = fio_syscall_mix(xfs0, args.work)
            accs = [accuracy(args, [xfs0, ext0], True, args.rounds, args.count),
                    accuracy(args, [xfs0, ext0], False, args.b2b_rounds, args.b2b_count)]
        if "2" in only:
            over, scrape = overhead_and_scrape(args, fss)
        if "5" in only:
            ser = series_count(args, fss[:4])
        if "4" in only:
            det = detection(args, xfs0)
        if "6" in only:
            scl = scale(args, fss)
        if "7" in only:
            amix = fio_append_syscalls(xfs0, args.work)
            if args.append_warmup:
                append_warmup(args, [xfs0, ext0], args.append_b2b_count)
            aaccs = [append_accuracy(args, [xfs0, ext0], True, args.append_rounds, args.append_count),
                     append_accuracy(args, [xfs0, ext0], False, args.append_b2b_rounds,
                                     args.append_b2b_count)]
        goals = goals_of(accs, over, scrape, det, scl, aaccs)
        report(args, mach, vers, build, backing, accs, mix, over, scrape, det, ser, scl, aaccs,
               amix, goals)
        print(f"\nwall time of the run: {time.monotonic() - started:.0f} s")
        return 1 if args.strict and not all(ok for _, _, ok in goals) else 0
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


if __name__ == "__main__":
    sys.exit(main())
