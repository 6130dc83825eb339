"""Two or more agent builds side by side on 64 directory targets at 1 s (64 tmpfs mounts
of 8 MiB this script makes and removes), for builds the `scale` section cannot run (older
ones without OpenMetrics). For each build in turn, order alternating by round:

    rss:      start, 90 s with a scrape every 15 s, VmRSS and VmHWM, then 500 keep-alive
              plain scrapes (p50, p99), stop
    latency:  start, 10 s to settle, 500 keep-alive plain scrapes (p50, p99), stop

Run as root from the repository root:

    python3 -m bench.pair rss OLD_BINARY NEW_BINARY [--rounds 2]
    python3 -m bench.pair latency OLD_BINARY NEW_BINARY ... [--rounds 3]

The tmpfs mounts are unmounted and the agents stopped (by their pid) on every exit path.
"""

import argparse
import http.client
import re
import statistics
import subprocess
import tempfile
import time
from pathlib import Path

TARGETS = 64


def vm(pid, key):
    st = Path(f"/proc/{pid}/status").read_text()
    return int(re.search(rf"^{key}:\s+(\d+) kB", st, re.M).group(1)) / 1024


class Agent:
    def __init__(self, binary, work):
        self.log = work / "agent.log"
        self.proc = subprocess.Popen(
            [binary, "--config", str(work / "config.yaml"), "--web.listen-address", "127.0.0.1:0"],
            stdout=self.log.open("w"), stderr=subprocess.STDOUT)
        deadline = time.monotonic() + 10
        while not (m := re.search(r"listening on \S*?:(\d+)", self.log.read_text())):
            if time.monotonic() > deadline or self.proc.poll() is not None:
                raise RuntimeError(f"{binary} did not start: {self.log.read_text()[-500:]}")
            time.sleep(0.1)
        self.port = int(m.group(1))
        self.conn = None

    def scrape(self, fresh=False):
        # The server closes a connection idle for long: the scrapes 15 s apart open anew.
        if fresh or self.conn is None:
            if self.conn:
                self.conn.close()
            self.conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=10)
        self.conn.request("GET", "/metrics", headers={"Accept": "text/plain;version=0.0.4"})
        r = self.conn.getresponse()
        body = r.read()
        if r.status != 200:
            raise RuntimeError(f"/metrics answered {r.status}")
        return body

    def burst(self, n=500):
        self.scrape(fresh=True)
        lat = []
        for _ in range(n):
            t = time.perf_counter()
            self.scrape()
            lat.append((time.perf_counter() - t) * 1000)
        lat.sort()
        return lat[len(lat) // 2], lat[int(len(lat) * 0.99) - 1]

    def stop(self):
        if self.conn:
            self.conn.close()
        self.proc.terminate()
        self.proc.wait(timeout=30)


def one(mode, binary, work):
    a = Agent(binary, work)
    try:
        if mode == "latency":
            time.sleep(10)
            return dict(zip(("p50", "p99"), a.burst()))
        t0 = time.monotonic()
        a.scrape(fresh=True)
        nxt = t0 + 15
        while nxt < t0 + 90:
            time.sleep(max(0, nxt - time.monotonic()))
            a.scrape(fresh=True)
            nxt += 15
        time.sleep(max(0, t0 + 90 - time.monotonic()))
        out = {"VmRSS": vm(a.proc.pid, "VmRSS"), "VmHWM": vm(a.proc.pid, "VmHWM")}
        out.update(zip(("p50", "p99"), a.burst()))
        return out
    finally:
        a.stop()


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("mode", choices=("rss", "latency"))
    ap.add_argument("binaries", nargs="+")
    ap.add_argument("--rounds", type=int, default=None)
    args = ap.parse_args()
    rounds = args.rounds or (2 if args.mode == "rss" else 3)
    with tempfile.TemporaryDirectory(prefix="stallwatch-pair.") as tmp:
        work = Path(tmp)
        mounted = []
        try:
            for i in range(TARGETS):
                d = work / f"t{i}"
                d.mkdir()
                subprocess.run(["mount", "-t", "tmpfs", "-o", "size=8m", f"sw-pair-{i}", str(d)], check=True)
                mounted.append(d)
            (work / "config.yaml").write_text("targets:\n" + "".join(
                f"  - path: {d}\n    name: t{i}\n" for i, d in enumerate(mounted)))
            res = {b: [] for b in args.binaries}
            for rnd in range(rounds):
                order = args.binaries if rnd % 2 == 0 else args.binaries[::-1]
                for b in order:
                    r = one(args.mode, b, work)
                    res[b].append(r)
                    print(f"round {rnd + 1} {b}: " + ", ".join(
                        f"{k} {v:.1f} MiB" if k.startswith("Vm") else f"{k} {v:.2f} ms"
                        for k, v in r.items()), flush=True)
            for b, rs in res.items():
                print(f"{b}: median " + ", ".join(
                    f"{k} {statistics.median(r[k] for r in rs):.{1 if k.startswith('Vm') else 2}f}"
                    + (" MiB" if k.startswith("Vm") else " ms") for k in rs[0]))
        finally:
            for d in mounted:
                subprocess.run(["umount", str(d)], check=False)


if __name__ == "__main__":
    main()
