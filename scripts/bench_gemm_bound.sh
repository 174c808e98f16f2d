#!/usr/bin/env bash
# mlp-ref on 1 rank against its GEMM bound (issue 12's acceptance: at least 85%). Alternates, REPS
# times: `dtrain run configs/mlp_ref.yaml` (1 rank, 1 thread), `dtrain bench gemm --threads 1`
# (the same GEMMs with nothing around them) and, when PEER=1 and python3-torch is installed, the
# PyTorch peer (bench/peers/torch_ddp_mlp.py 1) on the OpenBLAS kernels dtrain uses. Prints each
# sample, then the medians, dtrain's share of the bound (median of the per-repetition ratios, so a
# load change between repetitions cancels) and the spread (max / min) of each series as a noise
# figure: on a quiet machine it stays within a few percent. Each repetition also runs `dtrain bench
# step configs/mlp_ref.yaml`: the same 1-rank run with the step's GEMMs replayed between blocks of
# 20 steps in the same process, so both sides see the same machine (the VM's speed swings by up
# to 2x over seconds); its median per-block ratio is the interleaved figure.
#
#   scripts/bench_gemm_bound.sh            # REPS=3 PEER=1 STEPS=600
#   REPS=5 PEER=0 scripts/bench_gemm_bound.sh
set -euo pipefail
cd "$(dirname "$0")/.."
REPS=${REPS:-3}
PEER=${PEER:-1}
STEPS=${STEPS:-600}
BIN=${BIN:-build/bin/dtrain}
PEERS=${PEERS:-bench/peers}
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
json() { python3 -c 'import json,sys; print(json.loads(sys.stdin.read().splitlines()[-1])[sys.argv[1]])' "$1"; }
core=$("$BIN" bench gemm --iters 3 | json blas_core)
if [ "$PEER" = 1 ] && ! /usr/bin/python3 -c 'import torch' 2>/dev/null; then
  echo "no python3-torch: the PyTorch peer is skipped (PEER=0)"
  PEER=0
fi
echo "$(date -u +%FT%TZ) $(nproc) cores, load $(cut -d' ' -f1-3 /proc/loadavg), OpenBLAS kernels $core," \
  "$REPS repetitions of $STEPS steps"
: >"$out/d"; : >"$out/g"; : >"$out/t"; : >"$out/r"; : >"$out/i"
for i in $(seq "$REPS"); do
  "$BIN" run configs/mlp_ref.yaml --set "train.max_steps=$STEPS" --out "$out/run" --overwrite \
    --log-level warn --no-progress >/dev/null
  d=$(python3 -c 'import json,sys; print(round(json.load(open(sys.argv[1]))["train_samples_per_s"]))' \
    "$out/run/summary.json")
  g=$("$BIN" bench gemm --threads 1 --iters 300 | json bound_samples_per_s)
  f=$("$BIN" --log-level warn bench step configs/mlp_ref.yaml --steps "$STEPS" | json fraction_of_bound)
  echo "$f" >>"$out/i"
  line="rep $i: dtrain $d samples/s, GEMM bound $g samples/s, interleaved $(python3 -c "print(f'{$f * 100:.1f}%')")"
  if [ "$PEER" = 1 ]; then
    t=$(OPENBLAS_CORETYPE=$core /usr/bin/python3 "$PEERS/torch_ddp_mlp.py" 1 "$STEPS" |
      sed -n 's/.*samples\/s=\([0-9.]*\).*/\1/p')
    line="$line, torch $t samples/s"
    echo "$t" >>"$out/t"
  fi
  echo "$line"
  echo "$d" >>"$out/d"; echo "$g" >>"$out/g"
  python3 -c 'import sys; print(float(sys.argv[1]) / float(sys.argv[2]))' "$d" "$g" >>"$out/r"
done
python3 - "$out" "$PEER" <<'PY'
import statistics as st, sys
out, peer = sys.argv[1], sys.argv[2] == "1"
read = lambda n: [float(v) for v in open(f"{out}/{n}").read().split()]
d, g, r = read("d"), read("g"), read("r")
spread = lambda v: f"spread {max(v) / min(v):.2f}x"
print(f"median dtrain {st.median(d):.0f} samples/s ({spread(d)}), GEMM bound {st.median(g):.0f} "
      f"samples/s ({spread(g)}): dtrain at {st.median(r) * 100:.0f}% of the bound "
      f"(per-repetition {', '.join(f'{x * 100:.0f}%' for x in r)})")
i = read("i")
print(f"interleaved in one process (bench step): median {st.median(i) * 100:.1f}% of the bound "
      f"(per-repetition {', '.join(f'{x * 100:.0f}%' for x in i)})")
if peer:
    t = read("t")
    print(f"median torch {st.median(t):.0f} samples/s ({spread(t)}), dtrain / torch "
          f"{st.median(d) / st.median(t):.2f}x")
PY
