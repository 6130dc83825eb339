"""Section `series` (5): the sample lines of a real scrape of the agent with 4 loop
targets and the defaults, counted per target, per block device and globally."""

import re
import time

from ..harness import Agent, MeasureError, metric_values, samples, target_yaml
from ..tables import Table
from . import Section


def wait_up(agent, fss, timeout=15):
    deadline = time.monotonic() + timeout
    while True:
        text = agent.scrape()
        ups = [metric_values(text, "stallwatch_target_up", f.name) for f in fss]
        if all(u == [1.0] for u in ups):
            return
        if time.monotonic() > deadline:
            raise MeasureError(f"targets not up after {timeout} s: {ups}")
        time.sleep(0.2)


def count(text, fss):
    lines = samples(text)
    per_target = {f.name: [ln for ln in lines if f'target="{f.name}"' in ln] for f in fss}
    device = [ln for ln in lines if "target=" not in ln and "device=" in ln]
    glob = [ln for ln in lines if "target=" not in ln and "device=" not in ln]
    fams = {}
    for ln in per_target[fss[0].name]:
        n = re.sub(r"_(bucket|sum|count)$", "", ln.split("{")[0])
        fams[n] = fams.get(n, 0) + 1
    return {"total": len(lines), "per_target": {k: len(v) for k, v in per_target.items()},
            "device": len(device),
            "devices": len({re.search(r'device="([^"]+)"', ln).group(1) for ln in device}),
            "global": len(glob), "families": fams}


def measure(ctx):
    fss = ctx.loops()[:4]
    agent = Agent(ctx.binary, ctx.work, "agent4", "listen_address: 127.0.0.1:0\n" + target_yaml(fss))
    wait_up(agent, fss)
    time.sleep(1.5)  # one more VM-sampler pass (vm_interval 1 s) sees every target's device
    text = agent.scrape()
    agent.stop()
    return count(text, fss), []


def tables(data, params):
    pt = list(data["per_target"].values())
    rows = [("per target (target label)", "/".join(map(str, pt))),
            ("per block device (device label)", f"{data['device'] / max(1, data['devices']):.0f}"),
            ("global (vm, sysctl, psi, process, build)", data["global"]),
            ("total, 4 targets", data["total"])]
    return [Table(title="5. Series",
                  caption="sample lines of a real scrape, defaults: modes create+overwrite, fsync",
                  head=("series", "count"), rows=rows,
                  notes=["per target by family: " + ", ".join(
                      f"{k.replace('stallwatch_', '')} {v}" for k, v in data["families"].items())])]


SECTION = Section(
    name="series", aliases=("5",),
    summary="series of a scrape with 4 targets: per target, per device, global",
    params=(), default=True, measure=measure, tables=tables)
