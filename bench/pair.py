"""Two or more agent builds side by side on 64 directory targets at 1 s (64 tmpfs mounts
of 8 MiB this script makes and removes), for builds the `scale` section cannot run (older
ones without OpenMetrics). For each build in turn, order alternating by round:

    rss:      start, 90 s with a scrape every 15 s, VmRSS and VmHWM, then 500 keep-alive
              plain scrapes (p50, p99), stop
    latency:  start, 10 s to settle, 500 keep-alive plain scrapes (p50, p99), stop

Run as root from the repository root:

    python3 -m bench.pair rss OLD_BINARY NEW_BINARY [--rounds 2]
    python3 -m bench.pair latency OLD_BINARY NEW_BINARY ... [--rounds 3]

The tmpfs mounts and agents are the bench harness's (`harness.Tmpfs`, `harness.Agent`):
unmounted and stopped (by their pid) on every exit path, as in a bench run.
"""

import argparse
import statistics
import tempfile
import time
from pathlib import Path

from .harness import UNDO, Agent, Tmpfs, proc_stat, target_yaml
from .stats import pct

TARGETS = 64
PLAIN = "text/plain;version=0.0.4"


def burst(agent, n=500):
    """p50 and p99 (ms, nearest rank) of n keep-alive plain scrapes after a first one."""
    agent.client.get(accept=PLAIN)
    lat = [agent.client.get(accept=PLAIN)[1] * 1000 for _ in range(n)]
    return pct(lat, 50), pct(lat, 99)


def one(mode, binary, work, targets):
    a = Agent(binary, work, "pair", target_yaml(targets))
    try:
        if mode == "latency":
            time.sleep(10)
            return dict(zip(("p50", "p99"), burst(a)))
        t0 = time.monotonic()
        a.client.get(accept=PLAIN)
        nxt = t0 + 15
        while nxt < t0 + 90:
            time.sleep(max(0, nxt - time.monotonic()))
            a.client.get(accept=PLAIN)
            nxt += 15
        time.sleep(max(0, t0 + 90 - time.monotonic()))
        _, rss, hwm, _ = proc_stat(a.pid)
        out = {"VmRSS": rss / 1024, "VmHWM": hwm / 1024}
        out.update(zip(("p50", "p99"), burst(a)))
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
        try:
            targets = [Tmpfs(Path(tmp), i).create() for i in range(TARGETS)]
            res = {b: [] for b in args.binaries}
            for rnd in range(rounds):
                order = args.binaries if rnd % 2 == 0 else args.binaries[::-1]
                for b in order:
                    r = one(args.mode, b, Path(tmp), targets)
                    res[b].append(r)
                    print(f"round {rnd + 1} {b}: " + ", ".join(
                        f"{k} {v:.1f} MiB" if k.startswith("Vm") else f"{k} {v:.2f} ms"
                        for k, v in r.items()), flush=True)
            for b, rs in res.items():
                print(f"{b}: median " + ", ".join(
                    f"{k} {statistics.median(r[k] for r in rs):.{1 if k.startswith('Vm') else 2}f}"
                    + (" MiB" if k.startswith("Vm") else " ms") for k in rs[0]))
        finally:
            UNDO.run_all()


if __name__ == "__main__":
    main()
