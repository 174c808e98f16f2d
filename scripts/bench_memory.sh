#!/usr/bin/env bash
# Memory of the sharded strategies (README "Benchmarks"): configs/bench_50m.yaml (53.6M
# parameters, Adam) with `dtrain launch --nproc W` for W = 2 and 4 and every data-parallel
# strategy; prints rank 0's training-state bytes (summary.json, exact from the buffers) against
# the ZeRO accounting, and the rank's peak RSS. Each run is 3 steps; about 4 minutes on 2 cores.
set -euo pipefail
cd "$(dirname "$0")/.."
BIN=build/bin/dtrain
WORLDS=${WORLDS:-"2 4"}
STRATEGIES=${STRATEGIES:-"ddp zero1 zero2 fsdp"}
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
printf '%-3s %-6s %12s %12s %12s %12s %10s %14s %10s\n' W strategy params_MiB grads_MiB \
  optim_MiB state_MiB predicted gathered_MiB rss_MiB
for w in $WORLDS; do
  for s in $STRATEGIES; do
    "$BIN" launch --nproc "$w" configs/bench_50m.yaml --set distributed.strategy="$s" \
      --out "$out/$s$w" --log-level warn >/dev/null
    python3 - "$out/$s$w/summary.json" "$w" "$s" <<'PY'
import json, sys
d = json.load(open(sys.argv[1])); W = int(sys.argv[2]); s = sys.argv[3]
P = d["param_count"]; M = 1 << 20
# ZeRO accounting for fp32 Adam (4 bytes each of parameters, gradients, exp_avg, exp_avg_sq).
pred = {"ddp": 16 * P, "zero1": 8 * P + 8 * P / W, "zero2": 4 * P + 12 * P / W,
        "fsdp": 16 * P / W}[s]
state = d["param_bytes"] + d["grad_bytes"] + d["optim_bytes"]
print(f"{W:<3} {s:<6} {d['param_bytes']/M:12.1f} {d['grad_bytes']/M:12.1f} "
      f"{d['optim_bytes']/M:12.1f} {state/M:12.1f} {pred/M:10.1f} "
      f"{d['peak_gathered_bytes']/M:14.1f} {d['peak_rss_mb']:10.0f}")
PY
  done
done
