#!/usr/bin/env bash
# 2-rank mlp-ref benchmark (README "Benchmarks", issue 4): alternates, REPS times each,
#   dtrain 1 rank   (dtrain run configs/mlp_ref.yaml)
#   dtrain 2 ranks  (dtrain launch --nproc 2 configs/mlp_ref.yaml [$DDP_SET ...]; gRPC backend)
#   PyTorch DDP 2 ranks (bench/peers/torch_ddp_mlp.py 2, gloo)
# and prints each sample, the medians and the ratios: 2 ranks / 1 rank, dtrain / PyTorch, and
# exposed communication as a share of the 2-rank step time (summary.json).
# DDP_SET: extra --set arguments for the 2-rank run, e.g.
#   DDP_SET="--set distributed.shm=false" scripts/bench_mlp_ref_ddp.sh   (the TCP data path)
#   DDP_SET="--set distributed.shm=false --set distributed.tcp=false" ...  (gRPC streams only)
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
read -r -a extra <<<"${DDP_SET:-}"
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
median() { sort -g | awk '{a[NR]=$1} END {print (NR%2 ? a[(NR+1)/2] : (a[NR/2]+a[NR/2+1])/2)}'; }
field() { python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))[sys.argv[2]])' "$1" "$2"; }
: >"$out/one"; : >"$out/two"; : >"$out/exp"; : >"$out/t"
for i in $(seq "$REPS"); do
  "$BIN" run configs/mlp_ref.yaml --out "$out/one_run" --overwrite --log-level warn --no-progress >/dev/null
  one=$(field "$out/one_run/summary.json" train_samples_per_s)
  rm -rf "$out/two_run"
  "$BIN" --log-level warn launch --nproc 2 configs/mlp_ref.yaml --out "$out/two_run" --overwrite \
    ${extra[@]+"${extra[@]}"} >/dev/null 2>&1
  two=$(field "$out/two_run/summary.json" train_samples_per_s)
  exp=$(python3 -c 'import json,sys; s=json.load(open(sys.argv[1])); print(s["exposed_comm_s"]/s["train_s"])' \
    "$out/two_run/summary.json")
  t=$(OPENBLAS_CORETYPE=$PEER_CORE /usr/bin/python3 "$PEERS/torch_ddp_mlp.py" 2 600 | sed -n 's/.*samples\/s=\([0-9.]*\).*/\1/p')
  echo "rep $i: dtrain 1 rank $one, dtrain 2 ranks $two samples/s (exposed comm $exp of step), torch 2 ranks $t samples/s"
  echo "$one" >>"$out/one"; echo "$two" >>"$out/two"; echo "$exp" >>"$out/exp"; echo "$t" >>"$out/t"
done
python3 - "$(median <"$out/one")" "$(median <"$out/two")" "$(median <"$out/exp")" "$(median <"$out/t")" <<'PY'
import sys
one, two, exp, t = map(float, sys.argv[1:])
print(f"median: dtrain 1 rank {one:.0f}, 2 ranks {two:.0f} samples/s ({two/one:.2f}x of 1 rank, "
      f"exposed comm {exp*100:.0f}% of step); torch DDP 2 ranks {t:.0f} samples/s; dtrain/torch {two/t:.2f}x")
PY
