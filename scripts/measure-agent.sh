#!/usr/bin/env bash
# Figures for the agent issue (not a test): CPU time and peak RSS of the release agent
# with 4 targets at a 1 s interval over 60 s, and the median and slowest /metrics
# response while one target's XFS (a loop device made here) is frozen for 5 s.
# Needs root; undoes the freeze, mount and loop device on every exit path.
set -euo pipefail
cd "$(dirname "$0")/.."
cargo build --release --quiet
bin=target/release/stallwatch
work=$(mktemp -d)
pid="" dev=""
cleanup() {
  [ -n "$dev" ] && { fsfreeze -u "$work/mnt" 2>/dev/null || true; umount "$work/mnt" 2>/dev/null || true; losetup -d "$dev" 2>/dev/null || true; }
  [ -n "$pid" ] && kill "$pid" 2>/dev/null || true
  rm -rf "$work"
}
trap cleanup EXIT
start_agent() { # config file
  "$bin" --config "$1" --web.listen-address 127.0.0.1:0 2>"$work/log" &
  pid=$!
  for _ in $(seq 100); do grep -q 'listening on' "$work/log" && break; sleep 0.1; done
  port=$(grep -o 'listening on [0-9.]*:[0-9]*' "$work/log" | head -1 | sed 's/.*://')
}
cpu_ticks() { awk '{print $14+$15}' "/proc/$1/stat"; }

# 1. Overhead: 4 targets, 1 s interval, 60 s.
{ echo "targets:"; for i in 1 2 3 4; do mkdir -p "$work/t$i"; printf '  - path: %s\n    require_mountpoint: false\n    interval: 1s\n' "$work/t$i"; done; } > "$work/four.yaml"
start_agent "$work/four.yaml"
sleep 2
t0=$(cpu_ticks "$pid"); s0=$(date +%s.%N)
for _ in $(seq 4); do sleep 15; curl -s "127.0.0.1:$port/metrics" >/dev/null; done
t1=$(cpu_ticks "$pid"); s1=$(date +%s.%N)
hz=$(getconf CLK_TCK)
hwm=$(awk '/VmHWM/{print $2}' "/proc/$pid/status")
awk -v a="$t0" -v b="$t1" -v hz="$hz" -v s0="$s0" -v s1="$s1" -v hwm="$hwm" 'BEGIN{
  cpu=(b-a)/hz; wall=s1-s0;
  printf "overhead: 4 targets @1s, %.1f s wall: CPU %.2f s (%.3f%% of one core), peak RSS %.1f MiB\n", wall, cpu, 100*cpu/wall, hwm/1024 }'
kill "$pid"; wait "$pid" 2>/dev/null || true; pid=""

# 2. Scrapes during a 5 s freeze of one target.
truncate -s 320M "$work/img"; dev=$(losetup -f --show "$work/img"); mkfs.xfs -q -f "$dev"; mkdir "$work/mnt"; mount "$dev" "$work/mnt"
printf 'targets:\n  - path: %s\n    name: frozen\n    interval: 500ms\n  - path: %s\n    require_mountpoint: false\n    interval: 500ms\n' "$work/mnt" "$work/t1" > "$work/freeze.yaml"
start_agent "$work/freeze.yaml"
sleep 2
fsfreeze -f "$work/mnt"
end=$(( $(date +%s%N) + 5000000000 ))
: > "$work/times"
while [ "$(date +%s%N)" -lt "$end" ]; do
  curl -s -o /dev/null -w '%{time_total}\n' "127.0.0.1:$port/metrics" >> "$work/times"
  sleep 0.05
done
inflight=$(curl -s "127.0.0.1:$port/metrics" | awk '/^stallwatch_probe_inflight_seconds.*target="frozen"/{if($2>m)m=$2}END{print m+0}')
fsfreeze -u "$work/mnt"
sort -n "$work/times" | awk -v infl="$inflight" '{a[NR]=$1}END{
  printf "scrapes during a 5 s freeze: n=%d median %.2f ms, slowest %.2f ms; in-flight age at the end %.2f s\n", NR, 1000*a[int((NR+1)/2)], 1000*a[NR], infl }'
