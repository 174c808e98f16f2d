#!/usr/bin/env bash
# Sets up (scripts/setup.sh, building only the dtrain binary, not the tests), then trains
# configs/quickstart.yaml as 2 ranks over gRPC with `dtrain launch --nproc 2` and says where the
# results are. Environment: JOBS (parallel compile jobs, default nproc), BUILD_TYPE.
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD_DIR=build scripts/setup.sh dtrain
OUT=runs/quickstart
# The quickstart's folder is its own: a new quickstart replaces the last one (--overwrite),
# unless you continue it (scripts/quickstart.sh --resume auto).
FRESH=(--overwrite)
for a in "$@"; do [[ $a == --resume* ]] && FRESH=(); done
build/bin/dtrain launch --nproc 2 configs/quickstart.yaml --out "$OUT" "${FRESH[@]}" "$@"
echo
echo "quickstart: done. Summary: $OUT/summary.json  metrics: $OUT/metrics.jsonl  checkpoints: $OUT/checkpoints/  logs: $OUT/logs/"
cat "$OUT/summary.json"
