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
# A pipeline whose replicas run fsdp (pp2 x dp2, 4 ranks) against one process, on the same
# 53M-parameter budget split into eight Linear layers (784-2896x7-10) so that two stages can
# hold equal halves: rank 0 (stage 0) holds its stage's quarter of a replica's state.
if [ "${PIPELINE:-1}" = 1 ]; then
  deep=(--set 'model.hidden=[2896, 2896, 2896, 2896, 2896, 2896, 2896]')
  "$BIN" run configs/bench_50m.yaml "${deep[@]}" --set distributed.backend=inproc \
    --set distributed.world_size=1 --out "$out/one" --log-level warn >/dev/null
  "$BIN" launch --nproc 4 configs/bench_50m.yaml "${deep[@]}" --set distributed.strategy=fsdp \
    --set distributed.pipeline.stages=2 --out "$out/ppfsdp" --log-level warn >/dev/null
  python3 - "$out/one/summary.json" "$out/ppfsdp/summary.json" <<'PY'
import json, sys
one, pp = (json.load(open(p)) for p in sys.argv[1:3]); M = 1 << 20
st = lambda d: d["param_bytes"] + d["grad_bytes"] + d["optim_bytes"]
print(f"pp2 x dp2 fsdp, 784-2896x7-10 ({one['param_count']/1e6:.1f}M parameters): rank 0 holds "
      f"{st(pp)/M:.1f} of one process's {st(one)/M:.1f} MiB ({st(pp)/st(one):.3f}); "
      f"peak RSS {pp['peak_rss_mb']:.0f} vs {one['peak_rss_mb']:.0f} MiB")
PY
fi
