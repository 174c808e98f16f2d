#!/usr/bin/env bash
# Sets up (scripts/setup.sh), then trains configs/quickstart.yaml and says where the results are.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
OUT=runs/quickstart
build/bin/dtrain run configs/quickstart.yaml --out "$OUT" "$@"
echo
echo "quickstart: done. Summary: $OUT/summary.json  metrics: $OUT/metrics.jsonl  checkpoints: $OUT/checkpoints/"
cat "$OUT/summary.json"
