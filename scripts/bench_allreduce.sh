#!/usr/bin/env bash
# 2-rank all-reduce bus bandwidth (README "Benchmarks"): alternates, REPS times each,
#   dtrain over gRPC with the same-host shared-memory path (dtrain bench comm --backend grpc)
#   dtrain over its TCP data path (--no-shm: what ranks on different hosts use)
#   dtrain over the gRPC streams only (--no-shm --no-tcp: what they use with TLS on)
#   gloo (bench/peers/torch_allreduce.py 2)
# at SIZES (default 64K,1M,4M,16M,64M) and prints each sample's busbw and time, then the medians
# and the ratios. Needs python3-torch for gloo (apt-get install python3-torch).
set -euo pipefail
cd "$(dirname "$0")/.."
REPS=${REPS:-3}
SIZES=${SIZES:-64K,1M,4M,16M,64M}
PEERS=${PEERS:-bench/peers}
BIN=${BIN:-build/bin/dtrain}
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
for i in $(seq "$REPS"); do
  "$BIN" --log-level warn bench comm --backend grpc --nproc 2 --sizes "$SIZES" --json >>"$out/shm"
  "$BIN" --log-level warn bench comm --backend grpc --nproc 2 --sizes "$SIZES" --no-shm --json >>"$out/tcp"
  "$BIN" --log-level warn bench comm --backend grpc --nproc 2 --sizes "$SIZES" --no-shm --no-tcp --json >>"$out/streams"
  /usr/bin/python3 "$PEERS/torch_allreduce.py" 2 "$SIZES" >>"$out/gloo"
  echo "rep $i done" >&2
done
python3 - "$out" <<'PY'
import json, re, statistics, sys
out = sys.argv[1]
def dtrain(name):
    d = {}
    for line in open(f"{out}/{name}"):
        j = json.loads(line)
        d.setdefault(j["bytes"], []).append((j["busbw_gbps"], j["time_s"] * 1e6))
    return d
gloo = {}
for line in open(f"{out}/gloo"):
    m = re.search(r"bytes=(\d+) .*time_us=([0-9.]+) busbw=([0-9.]+)", line)
    if m:
        gloo.setdefault(int(m.group(1)), []).append((float(m.group(3)), float(m.group(2))))
shm, tcp, streams = dtrain("shm"), dtrain("tcp"), dtrain("streams")
med = lambda v, k: statistics.median(x[k] for x in v)
print(f"{'size':>8} | {'shm GB/s':>9} {'us':>8} | {'tcp GB/s':>9} {'us':>8} | {'streams GB/s':>12} {'us':>8} | {'gloo GB/s':>9} {'us':>8} | tcp/gloo | streams/gloo")
for b in sorted(gloo):
    s, p, t, g = shm[b], tcp[b], streams[b], gloo[b]
    label = f"{b >> 20} MiB" if b >= 1 << 20 else f"{b >> 10} KiB"
    print(f"{label:>8} | {med(s,0):9.2f} {med(s,1):8.0f} | {med(p,0):9.2f} {med(p,1):8.0f} | "
          f"{med(t,0):12.2f} {med(t,1):8.0f} | {med(g,0):9.2f} {med(g,1):8.0f} | "
          f"{med(p,0)/med(g,0):7.2f}x | {med(t,0)/med(g,0):11.2f}x")
PY
