#!/usr/bin/env bash
# Sets up (scripts/setup.sh), then trains configs/quickstart.yaml as 2 ranks over gRPC with
# `dtrain launch --nproc 2` and says where the results are.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
OUT=runs/quickstart
build/bin/dtrain launch --nproc 2 configs/quickstart.yaml --out "$OUT" "$@"
echo
echo "quickstart: done. Summary: $OUT/summary.json  metrics: $OUT/metrics.jsonl  checkpoints: $OUT/checkpoints/  logs: $OUT/logs/"
cat "$OUT/summary.json"
