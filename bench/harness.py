"""The harness every section runs on: the undo stack, processes started and stopped by
pid, loop and tmpfs filesystems, the agent, node_exporter, the HTTP clients, freezes,
and CPU/RSS sampling from /proc.

Everything a run creates registers its undo on `UNDO` as it is created; `UNDO.run_all()`
runs on every exit path (the CLI calls it in a `finally`), thawing first.
"""

import http.client
import os
import re
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

NODE_EXPORTER = "/usr/bin/prometheus-node-exporter"
CLK_TCK = os.sysconf("SC_CLK_TCK")
TOOLS = ("fio", "ioping", "strace", "curl", "stdbuf", "mkfs.xfs", "mkfs.ext4", "losetup",
         "fsfreeze", "truncate", "findmnt", NODE_EXPORTER)


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


def freezer(mnt, hold):
    """A child that freezes mnt, prints "frozen", and thaws it itself after hold s
    (printing "thawed"), even if the runner dies."""
    fz = subprocess.Popen(["sh", "-c", 'fsfreeze -f "$1" && echo frozen; sleep "$2"; '
                           'fsfreeze -u "$1"; echo thawed', "sh", str(mnt), str(hold)],
                          stdout=subprocess.PIPE, text=True, start_new_session=True)
    UNDO.frozen.add(mnt)
    UNDO.push(f"stop freezer (pid {fz.pid})", lambda: stop_proc(fz))
    return fz


# ---------------------------------------------------------------------------------------
# Processes


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


class LineReader(threading.Thread):
    """Collects (monotonic time, line) from a pipe as lines arrive."""

    def __init__(self, pipe):
        super().__init__(daemon=True)
        self.pipe, self.lines = pipe, []

    def run(self):
        for ln in self.pipe:
            self.lines.append((time.monotonic(), ln.rstrip("\n")))


def proc_stat(pid):
    """(cpu seconds utime+stime, VmRSS KiB, VmHWM KiB, threads)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    cpu = (int(fields[11]) + int(fields[12])) / CLK_TCK
    st = Path(f"/proc/{pid}/status").read_text()

    def get(k):
        return int(re.search(rf"^{k}:\s+(\d+)", st, re.M).group(1))

    return cpu, get("VmRSS"), get("VmHWM"), get("Threads")


def usage(before, after):
    """A process's CPU over a window and its memory at the end, from two proc_stat()."""
    return {"cpu": after[0] - before[0], "rss": after[1], "hwm": after[2], "threads": after[3]}


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


def task_cpu(pid):
    """CPU seconds of the live threads of pid, summed from their schedstat (ns): where
    /proc/PID/stat's utime+stime step by 1/CLK_TCK (10 ms), too coarse for a block of 25
    scrapes or an idle window of a second. A thread that exits takes its time with it."""
    ns = 0
    for t in Path(f"/proc/{pid}/task").iterdir():
        try:
            ns += int((t / "schedstat").read_text().split()[0])
        except OSError:
            continue
    return ns / 1e9


def thread_seconds(before, after):
    """CPU seconds per thread name between two thread_cpu() readings."""
    return {k: (v - before.get(k, 0)) / 1e9 for k, v in after.items()}


def lane_cpu(threads):
    """Seconds of CPU of all probe lane threads."""
    return sum(v for k, v in threads.items() if k.startswith("lanes-"))


def io_pressure():
    """Seconds the host has spent with some task waiting on I/O (PSI), or None."""
    try:
        m = re.search(r"some .*total=(\d+)", Path("/proc/pressure/io").read_text())
        return int(m.group(1)) / 1e6 if m else None
    except OSError:
        return None


class PressureWindow:
    """The share of a window the host spent under I/O pressure: start(), then share()."""

    def __init__(self):
        self.p0, self.t0 = io_pressure(), time.monotonic()

    def share(self):
        p1, t1 = io_pressure(), time.monotonic()
        return (p1 - self.p0) / (t1 - self.t0) if self.p0 is not None else None


# ---------------------------------------------------------------------------------------
# Filesystems


class Fs:
    """A sparse 320 MiB image on a loop device with XFS or ext4, mounted under work."""

    def __init__(self, work, kind, idx, name=None):
        self.kind = kind
        self.name = name or f"{kind[0]}{idx}"  # x0, e0, ...
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


def umount(mnt):
    for _ in range(10):  # a process we just stopped may still hold it for a moment
        if run(["umount", str(mnt)], timeout=60, check=False).returncode == 0:
            return
        time.sleep(0.5)
    run(["umount", "-l", str(mnt)], timeout=60)


def loop_filesystems(work):
    """The run's eight loop filesystems: x0, e0, x1, e1, ... (4 XFS, 4 ext4)."""
    log(f"work directory {work}; creating 8 loop filesystems")
    try:
        return [Fs(work, k, i).create() for i in range(4) for k in ("xfs", "ext4")]
    except MeasureError as e:
        raise SetupError(f"cannot create loop filesystems: {e}") from e


# ---------------------------------------------------------------------------------------
# HTTP


class Client:
    """A keep-alive HTTP/1.1 client for one server; times a request to the last byte."""

    def __init__(self, addr):
        host, port = addr.rsplit(":", 1)
        self.host, self.port = host, int(port)
        self.conn = None

    def get(self, path="/metrics", gzip=False, timeout=5, accept=None):
        headers = {"Accept-Encoding": "gzip"} if gzip else {"Accept-Encoding": "identity"}
        if accept:
            headers["Accept"] = accept
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


def get_timed(client, path, n):
    """Seconds of n GETs of path, one after the other."""
    return [client.get(path)[1] for _ in range(n)]


def curl_block(url, n, gzip, accept=None):
    """n keep-alive GETs in one curl, with `Accept: accept` if given (else curl's */*):
    (seconds to last byte less connect, bytes, Content-Encoding, Content-Type) each."""
    cmd = ["curl", "-s", "-H", f"Accept-Encoding: {'gzip' if gzip else 'identity'}", "-w",
           "%{time_total}\\t%{time_connect}\\t%{size_download}\\t%{http_code}\\t"
           "%header{content-encoding}\\t%{content_type}\\n"]
    if accept:
        cmd += ["-H", f"Accept: {accept}"]
    for _ in range(n):
        cmd += ["-o", "/dev/null", url]
    r = run(cmd, timeout=120)
    out = []
    for ln in r.stdout.splitlines():
        f = ln.split("\t")
        if len(f) != 6 or f[3] != "200":
            raise MeasureError(f"GET {url}: {ln!r}")
        out.append((float(f[0]) - float(f[1]), int(f[2]), f[4], f[5]))
    if len(out) != n:
        raise MeasureError(f"GET {url}: {len(out)} responses of {n}")
    return out


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def samples(text):
    """Non-comment lines of a Prometheus text scrape."""
    return [ln for ln in text.splitlines() if ln and not ln.startswith("#")]


def metric_values(text, name, target):
    """Values of the samples of `name` whose labels include target="<target>"."""
    pat = re.compile(r'^' + re.escape(name) + r'\{([^}]*)\} (\S+)$')
    out = []
    for ln in text.splitlines():
        m = pat.match(ln)
        if m and f'target="{target}"' in m.group(1):
            out.append(float(m.group(2)))
    return out


def metric_sum(text, name, targets):
    """The sum over targets of the values of `name`."""
    return sum(sum(metric_values(text, name, t.name)) for t in targets)


# ---------------------------------------------------------------------------------------
# The agent and node_exporter


class Agent:
    """stallwatch with a configuration written to work/<name>.yaml, on a port of its own."""

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

    @property
    def pid(self):
        return self.proc.pid

    def scrape(self):
        return self.client.get()[0].decode()

    def stop(self):
        self.client.close()
        stop_proc(self.proc)


def target_yaml(fss, extra=""):
    return "targets:\n" + "".join(f"  - path: {f.mnt}\n    name: {f.name}\n{extra}" for f in fss)


def wait_all_up(agent, targets, timeout):
    """Scrapes until every target's stallwatch_target_up is 1; returns that scrape."""
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


class NodeExporter:
    """prometheus-node-exporter with its default collectors on a free port."""

    def __init__(self, work, tag):
        self.port = free_port()
        self.log = work / f"node_exporter-{tag}.log"
        self.proc = start_proc([NODE_EXPORTER, f"--web.listen-address=127.0.0.1:{self.port}"],
                               self.log, f"node_exporter {tag}")
        self.addr = f"127.0.0.1:{self.port}"
        self.client = Client(self.addr)
        deadline = time.monotonic() + 15
        while True:
            try:
                self.client.get()
                return
            except (OSError, http.client.HTTPException, MeasureError):
                if time.monotonic() > deadline or self.proc.poll() is not None:
                    raise SetupError(f"node_exporter did not start:\n{self.log.read_text()[-2000:]}")
                time.sleep(0.1)

    @property
    def pid(self):
        return self.proc.pid

    def stop(self):
        self.client.close()
        stop_proc(self.proc)


def scrape_every_15s(agent, ne, window):
    """Scrapes the agent and node_exporter together every 15 s until `window` s have
    passed since the call (the first pair at once); returns (elapsed s, scrapes, the
    agent's first scrape text)."""
    t0 = time.monotonic()
    scrapes = 0
    first = None
    while True:
        text = agent.scrape()
        first = first or text
        ne.client.get()
        scrapes += 1
        nxt = t0 + 15 * scrapes
        if nxt >= t0 + window:
            break
        time.sleep(max(0, nxt - time.monotonic()))
    time.sleep(max(0, t0 + window - time.monotonic()))
    return time.monotonic() - t0, scrapes, first
