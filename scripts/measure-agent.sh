#!/usr/bin/env bash
# The agent's own figures on one machine (not a test): section `agent` of the bench
# (bench/sections/agent.py), which took over what this script measured: CPU time and
# peak RSS with 4 targets at a 1 s interval over 60 s, and the median and slowest
# /metrics response while one target's XFS (a loop device made by the bench) is frozen
# for 5 s. Needs root; the bench undoes the freeze, mount and loop device on every exit
# path. Extra arguments go to the bench (e.g. --json FILE, --agent-window 120).
set -euo pipefail
cd "$(dirname "$0")/.."
cargo build --release --quiet
exec bench/run.py --only agent "$@"
