#!/usr/bin/env bash
# The engine against another dtrain binary, side by side (README "Benchmarks"), REPS times
# alternated (default 3), medians:
#   - mlp-ref (configs/mlp_ref.yaml) on 2 ranks over gRPC (shared memory): step time of ddp,
#     zero1, zero2 and fsdp (train_s / steps);
#   - configs/bench_pipeline.yaml (S = 2, M = 8, 1f1b): each stage's bubble fraction;
#   - pipeline x data parallel, 4 ranks (2 stages x 2 replicas) on bench_pipeline's model: ddp
#     and (new binary only: the old one ran only ddp on a pipeline's replicas) fsdp on the data
#     axis; samples/s and rank 0's training-state bytes.
# BIN (default build/bin/dtrain) is measured against OLD (default: none, BIN alone), e.g.
#   OLD=/path/to/old/build/bin/dtrain scripts/bench_layouts.sh
set -euo pipefail
cd "$(dirname "$0")/.."
REPS=${REPS:-3}
BIN=${BIN:-build/bin/dtrain}
OLD=${OLD:-}
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
bins=("new=$BIN")
[ -n "$OLD" ] && bins+=("old=$OLD")
summary() { # tag, summary.json -> one line of figures
  python3 -c '
import json, sys
s = json.load(open(sys.argv[2]))
st = s.get("stages") or []
b = ",".join("%.4f" % x["bubble_fraction"] for x in st) or "-"
mem = (s["param_bytes"] + s["grad_bytes"] + s["optim_bytes"]) / 2**20
print(sys.argv[1], 1e3 * s["train_s"] / s["steps"], s["train_samples_per_s"], b, mem)' \
    "$1" "$2" | tee -a "$out/all"
}
for i in $(seq "$REPS"); do
  for nb in "${bins[@]}"; do
    name=${nb%%=*} bin=${nb#*=}
    for s in ddp zero1 zero2 fsdp; do
      "$bin" --log-level warn launch --nproc 2 configs/mlp_ref.yaml --out "$out/r" --overwrite \
        --set distributed.strategy="$s" >/dev/null 2>&1
      summary "$name:mlp-ref:$s" "$out/r/summary.json"
    done
    "$bin" --log-level warn launch --nproc 2 configs/bench_pipeline.yaml --out "$out/r" \
      --overwrite >/dev/null 2>&1
    summary "$name:pipeline-1f1b:S2" "$out/r/summary.json"
    strategies="ddp fsdp"
    [ "$name" = old ] && strategies="pipeline"
    for s in $strategies; do
      set -- --set distributed.pipeline.stages=2
      [ "$s" = pipeline ] && set --
      "$bin" --log-level warn launch --nproc 4 configs/bench_pipeline.yaml --out "$out/r" \
        --overwrite --set distributed.world_size=4 --set distributed.strategy="$s" "$@" \
        >/dev/null 2>&1
      summary "$name:pp2xdp2:${s/pipeline/ddp}" "$out/r/summary.json"
    done
  done
done
python3 - "$out/all" <<'PY'
import statistics, sys
rows = {}
for line in open(sys.argv[1]):
    tag, ms, sps, bubble, mem = line.split()
    rows.setdefault(tag, []).append((float(ms), float(sps), bubble, float(mem)))
print(f"\n{'run':<28} {'ms/step':>9} {'samples/s':>10} {'bubbles (median run)':>22} {'state MiB':>10}")
for tag, v in rows.items():
    v.sort()
    mid = v[len(v) // 2]
    print(f"{tag:<28} {mid[0]:9.2f} {statistics.median(x[1] for x in v):10.0f} {mid[2]:>22} {mid[3]:10.1f}")
PY
