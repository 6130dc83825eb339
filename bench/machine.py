"""Where a run ran: the machine, the tools' versions, the binary and the commit."""

import hashlib
import os
import re
import shutil
import time
from pathlib import Path

from .harness import NODE_EXPORTER, run

REPO = Path(__file__).resolve().parent.parent


def machine(work):
    """CPUs, model, memory, kernel, virtualisation, load average, the loop images' disk."""
    cpu = re.search(r"^model name\s*:\s*(.*)$", Path("/proc/cpuinfo").read_text(), re.M)
    mem = re.search(r"^MemTotal:\s*(\d+)", Path("/proc/meminfo").read_text(), re.M)
    virt = run(["systemd-detect-virt"], check=False).stdout.strip() if shutil.which(
        "systemd-detect-virt") else "?"
    backing = run(["findmnt", "-n", "-o", "SOURCE,FSTYPE", "-T", str(work)],
                  check=False).stdout.strip() or "?"
    return {
        "nproc": os.cpu_count(), "cpu": cpu.group(1) if cpu else "?",
        "kernel": os.uname().release, "mem_gib": int(mem.group(1)) / 2**20 if mem else 0,
        "virt": virt, "loadavg_before": list(os.getloadavg()), "loop_images_on": backing,
    }


def versions(binary, work):
    """The first line of each tool's version output."""
    v = {}
    for name, cmd in (("stallwatch", [str(binary), "--version"]), ("fio", ["fio", "--version"]),
                      ("ioping", ["ioping", "-v"]),
                      ("node_exporter", [NODE_EXPORTER, "--version"]),
                      ("mkfs.xfs", ["mkfs.xfs", "-V"]), ("mke2fs", ["mke2fs", "-V"])):
        out = run(cmd, check=False, cwd=work)
        text = (out.stdout + out.stderr).strip()
        v[name] = text.splitlines()[0] if text else "?"
    return v


def commit():
    """`git rev-parse HEAD` of the repository the bench lives in, or "?"."""
    out = run(["git", "-C", str(REPO), "rev-parse", "HEAD"], check=False).stdout.strip()
    return out or "?"


def binary_identity(src, copy):
    """The binary's path, build time and hash, and whether it is older than the sources."""
    h = hashlib.sha256(copy.read_bytes()).hexdigest()[:12]
    mtime = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(src.stat().st_mtime))
    git = run(["git", "-C", str(REPO), "rev-parse", "--short", "HEAD"], check=False).stdout.strip()
    dirty = run(["git", "-C", str(REPO), "status", "--porcelain", "--", "src", "Cargo.toml",
                 "Cargo.lock"], check=False).stdout.strip()
    sources = [*(REPO / "src").rglob("*.rs"), REPO / "Cargo.toml"]
    newest = max((f.stat().st_mtime for f in sources if f.exists()), default=0)
    stale = newest > src.stat().st_mtime
    return (f"{src} built {mtime}, sha256 {h}; HEAD {git or '?'}"
            f"{', uncommitted changes in src/' if dirty else ''}; "
            + ("OLDER than the newest source file: run cargo build --release" if stale
               else "newer than every source file"))
