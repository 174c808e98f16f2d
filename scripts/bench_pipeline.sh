#!/usr/bin/env bash
# Pipeline benchmark (README "Benchmarks"): configs/bench_pipeline.yaml (16 x 1024 MLP, S = 2,
# M = 8, gRPC) with gpipe, 1f1b and 1f1b + activation checkpointing, REPS times each alternated;
# prints per stage the median bubble fraction (1 - compute / time inside the schedule) against
# (S - 1) / (M + S - 1), and the peak stored activations.
set -euo pipefail
cd "$(dirname "$0")/.."
REPS=${REPS:-3}
BIN=build/bin/dtrain
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
for i in $(seq "$REPS"); do
  for v in "gpipe false" "1f1b false" "1f1b true"; do
    set -- $v
    "$BIN" launch --nproc 2 configs/bench_pipeline.yaml --set distributed.pipeline.schedule="$1" \
      --set distributed.pipeline.activation_checkpointing="$2" --out "$out/$1-$2-$i" \
      --log-level warn >/dev/null
  done
done
python3 - "$out" "$REPS" <<'PY'
import json, statistics, sys
out, reps = sys.argv[1], int(sys.argv[2])
print("theory (S-1)/(M+S-1) = 1/9 = 0.111")
print(f"{'schedule':<22} {'stage':>5} {'bubble':>8} {'peak_act_MiB':>13} {'samples/s':>10}")
for sched, ck in (("gpipe", "false"), ("1f1b", "false"), ("1f1b", "true")):
    runs = [json.load(open(f"{out}/{sched}-{ck}-{i}/summary.json")) for i in range(1, reps + 1)]
    for s in range(len(runs[0]["stages"])):
        b = statistics.median(r["stages"][s]["bubble_fraction"] for r in runs)
        a = statistics.median(r["stages"][s]["peak_activation_bytes"] for r in runs) / 2**20
        sps = statistics.median(r["train_samples_per_s"] for r in runs)
        name = sched + (" + checkpointing" if ck == "true" else "")
        print(f"{name:<22} {s:>5} {b:>8.3f} {a:>13.2f} {sps:>10.0f}")
PY
