#!/usr/bin/env bash
# mlp-ref benchmark (README "Benchmarks"): dtrain (configs/mlp_ref.yaml, 1 thread) against
# PyTorch (bench/peers/torch_ddp_mlp.py 1, 1 thread) in the same run, alternating, REPS
# times each; prints each sample, the medians, the ratio, and the GEMM bound.
# Needs python3-torch for the peer (apt-get install python3-torch), run with /usr/bin/python3.
set -euo pipefail
cd "$(dirname "$0")/.."
REPS=${REPS:-5}
PEERS=${PEERS:-bench/peers}
BIN=build/bin/dtrain
# The peer runs on the OpenBLAS kernels dtrain runs (Debian's PyTorch uses the system OpenBLAS,
# which falls back to SSE3 kernels on CPUs it does not know; dtrain re-executes itself with the
# right ones: tensor/blas.h). PEER_CORE overrides.
PEER_CORE=${PEER_CORE:-$("$BIN" bench gemm --iters 3 | sed -n 's/.*"blas_core": "\([A-Za-z0-9]*\)".*/\1/p')}
echo "OpenBLAS kernels for both sides: $PEER_CORE"
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
median() { sort -g | awk '{a[NR]=$1} END {print (NR%2 ? a[(NR+1)/2] : (a[NR/2]+a[NR/2+1])/2)}'; }
: >"$out/d"; : >"$out/t"
for i in $(seq "$REPS"); do
  "$BIN" run configs/mlp_ref.yaml --out "$out/run" --overwrite --log-level warn --no-progress >/dev/null
  d=$(python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["train_samples_per_s"])' "$out/run/summary.json")
  t=$(OPENBLAS_CORETYPE=$PEER_CORE /usr/bin/python3 "$PEERS/torch_ddp_mlp.py" 1 600 | sed -n 's/.*samples\/s=\([0-9.]*\).*/\1/p')
  echo "rep $i: dtrain $d samples/s, torch $t samples/s"
  echo "$d" >>"$out/d"; echo "$t" >>"$out/t"
done
g=$("$BIN" bench gemm --threads 1 --iters 300 | python3 -c 'import json,sys; print(json.loads(sys.stdin.read().splitlines()[-1])["bound_samples_per_s"])')
dm=$(median <"$out/d"); tm=$(median <"$out/t")
python3 - "$dm" "$tm" "$g" <<'PY'
import sys
d, t, g = map(float, sys.argv[1:])
print(f"median dtrain {d:.0f} samples/s, torch {t:.0f} samples/s, ratio {d/t:.2f}x; "
      f"GEMM bound {g:.0f} samples/s, dtrain at {d/g*100:.0f}% of it")
PY
