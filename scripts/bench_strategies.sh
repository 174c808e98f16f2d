#!/usr/bin/env bash
# mlp-ref on 2 ranks over gRPC (shared memory), alternated REPS times (README "Benchmarks"):
#   step time of every data-parallel strategy (ddp, zero1, zero2, fsdp) and of ddp at several
#   gradient bucket caps (distributed.ddp.bucket_mb, BUCKETS, default 0.25 1 4 32),
# from summary.json (train_s / steps); prints each sample and the medians.
set -euo pipefail
cd "$(dirname "$0")/.."
REPS=${REPS:-3}
BUCKETS=${BUCKETS:-0.25 1 4 32}
BIN=build/bin/dtrain
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
run() { # name, extra --set arguments...
  local name=$1
  shift
  "$BIN" --log-level warn launch --nproc 2 configs/mlp_ref.yaml --out "$out/run" --overwrite "$@" \
    >/dev/null 2>&1
  python3 -c 'import json,sys; s=json.load(open(sys.argv[1])); print(sys.argv[2], 1e3*s["train_s"]/s["steps"], s["train_samples_per_s"], s["exposed_comm_s"]/s["train_s"])' \
    "$out/run/summary.json" "$name" | tee -a "$out/all"
}
for i in $(seq "$REPS"); do
  for s in ddp zero1 zero2 fsdp; do run "$s" --set distributed.strategy="$s"; done
  for b in $BUCKETS; do run "ddp-bucket-$b" --set distributed.ddp.bucket_mb="$b"; done
done
python3 - "$out/all" <<'PY'
import statistics, sys
rows = {}
for line in open(sys.argv[1]):
    name, ms, sps, exp = line.split()
    rows.setdefault(name, []).append((float(ms), float(sps), float(exp)))
for name, v in rows.items():
    m = lambda k: statistics.median(x[k] for x in v)
    print(f"{name:16s} median {m(0):6.2f} ms/step {m(1):8.0f} samples/s exposed comm {100*m(2):4.1f}% ({len(v)} runs)")
PY
