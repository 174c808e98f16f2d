#!/usr/bin/env bash
# cnn-ref and the GPT against their PyTorch peers and their GEMM bounds, then on 2 ranks (issue
# 13's benchmarks; README "Benchmarks"). Alternates, REPS times:
#   dtrain run configs/fmnist_cnn.yaml, STEPS steps     vs  torch_cnn_fmnist.py 1 1 STEPS
#   dtrain bench gemm --config configs/fmnist_cnn.yaml   (the same step's GEMMs alone)
#   dtrain run configs/lm_jargon.yaml, STEPS steps      vs  torch_gpt_char.py --steps STEPS JARGON
#   dtrain bench gemm --config configs/lm_jargon.yaml
#   and, with DIST=1, each model on 2 ranks (dtrain launch --nproc 2: gRPC with same-host shared
#   memory) as ddp and as fsdp.
# Everything runs on 1 thread (the configs' runtime.threads, the peers' THREADS/--threads
# default) with the same OpenBLAS kernels (OPENBLAS_CORETYPE, bench_lib.sh). dtrain's figure is
# summary.json's train_samples_per_s: samples over the time inside training steps, so data
# loading, start-up, evaluation and checkpoints are outside it (both runs skip their test split to
# save time); the peers time their steps alone too (the CNN after 10 warm-up steps, on one fixed
# batch; the GPT without its evaluations). A GPT sample is block_size = 64 tokens. 2 ranks run
# batch 128 (12) per rank, so they process twice the samples per step.
# Prints each repetition, then medians with spreads (max / min), the ratios dtrain / torch and the
# fraction of the GEMM bound reached (medians of the per-repetition ratios, so a load change
# between repetitions cancels), and 2 ranks / 1 rank.
#
#   scripts/bench_models.sh                      # REPS=3 STEPS=200 PEER=1 DIST=1
#   REPS=5 DIST=0 scripts/bench_models.sh
set -euo pipefail
cd "$(dirname "$0")/.."
REPS=${REPS:-3}
STEPS=${STEPS:-200}
PEER=${PEER:-1}
DIST=${DIST:-1}
BIN=${BIN:-build/bin/dtrain}
PEERS=${PEERS:-bench/peers}
JARGON=${JARGON:-/usr/share/doc/jargon-text/jargon.txt.gz}
source scripts/bench_lib.sh
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
if [ "$PEER" = 1 ] && ! have_torch; then
  echo "no python3-torch: the PyTorch peers are skipped (PEER=0)"
  PEER=0
fi
core=$(blas_core)
bench_header "$REPS repetitions of $STEPS steps"

CNN=(configs/fmnist_cnn.yaml --set 'data.test={}')
GPT=(configs/lm_jargon.yaml --set data.test_fraction=0)

# dtrain_rate KIND ARGS...: one run (KIND run or launch), its training throughput in the model's
# units (samples/s; tokens/s for the GPT: samples x 64).
dtrain_rate() {
  local kind=$1 tokens=1
  shift
  [ "$1" = configs/lm_jargon.yaml ] && tokens=64
  rm -rf "$out/run"
  local cmd=("$BIN" --log-level warn run --no-progress)
  [ "$kind" = launch ] && cmd=("$BIN" --log-level warn launch --nproc 2)
  if ! "${cmd[@]}" "$@" --set train.max_steps="$STEPS" --set train.epochs=0 --out "$out/run" \
    --overwrite >"$out/log" 2>&1; then
    echo "failed: ${cmd[*]} $*" >&2
    tail -20 "$out/log" >&2
    [ -d "$out/run/logs" ] && tail -n 20 "$out"/run/logs/*.log >&2
    exit 1
  fi
  python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["train_samples_per_s"] * int(sys.argv[2]))' \
    "$out/run/summary.json" "$tokens"
}
bound() { "$BIN" bench gemm --config "$1" --threads 1 | last_json bound_per_s; }
keep() { echo "$2" >>"$out/$1"; }

for i in $(seq "$REPS"); do
  line="rep $i:"
  d=$(dtrain_rate run "${CNN[@]}"); keep cnn_d "$d"; line="$line cnn dtrain $d"
  if [ "$PEER" = 1 ]; then
    t=$(OPENBLAS_CORETYPE=$core /usr/bin/python3 "$PEERS/torch_cnn_fmnist.py" 1 1 "$STEPS" |
      sed -n 's/.*samples_per_s=\([0-9.]*\).*/\1/p')
    keep cnn_t "$t"; line="$line torch $t"
  fi
  g=$(bound configs/fmnist_cnn.yaml); keep cnn_g "$g"; line="$line bound $g samples/s;"
  d=$(dtrain_rate run "${GPT[@]}"); keep gpt_d "$d"; line="$line gpt dtrain $d"
  if [ "$PEER" = 1 ]; then
    t=$(OPENBLAS_CORETYPE=$core /usr/bin/python3 "$PEERS/torch_gpt_char.py" --steps "$STEPS" "$JARGON" |
      sed -n 's/.*tokens_per_s=\([0-9.]*\).*/\1/p')
    keep gpt_t "$t"; line="$line torch $t"
  fi
  g=$(bound configs/lm_jargon.yaml); keep gpt_g "$g"; line="$line bound $g tokens/s"
  echo "$line"
  if [ "$DIST" = 1 ]; then
    line="rep $i, 2 ranks:"
    for s in ddp fsdp; do
      d=$(dtrain_rate launch "${CNN[@]}" --set distributed.strategy=$s); keep "cnn_$s" "$d"
      line="$line cnn $s $d samples/s,"
      d=$(dtrain_rate launch "${GPT[@]}" --set distributed.strategy=$s); keep "gpt_$s" "$d"
      line="$line gpt $s $d tokens/s,"
    done
    echo "${line%,}"
  fi
done
echo "$(date -u +%FT%TZ) done, load $(cut -d' ' -f1-3 /proc/loadavg)"

python3 - "$out" <<'PY'
import os, statistics as st, sys
out = sys.argv[1]
def read(n):
    p = f"{out}/{n}"
    return [float(v) for v in open(p).read().split()] if os.path.exists(p) else []
spread = lambda v: f"spread {max(v) / min(v):.2f}x"
def ratio(a, b):  # median of the per-repetition ratios
    return st.median(x / y for x, y in zip(a, b))
for name, unit in (("cnn", "samples/s"), ("gpt", "tokens/s")):
    d, t, g = read(f"{name}_d"), read(f"{name}_t"), read(f"{name}_g")
    print(f"{name}: dtrain {st.median(d):.0f} {unit} ({spread(d)}), GEMM bound {st.median(g):.0f} "
          f"({spread(g)}): dtrain at {ratio(d, g) * 100:.0f}% of the bound")
    if t:
        print(f"{name}: torch {st.median(t):.0f} {unit} ({spread(t)}), at {ratio(t, g) * 100:.0f}% "
              f"of the bound; dtrain / torch {ratio(d, t):.2f}x "
              f"(per repetition {', '.join(f'{x / y:.2f}' for x, y in zip(d, t))})")
    for s in ("ddp", "fsdp"):
        two = read(f"{name}_{s}")
        if two:
            print(f"{name}: 2 ranks {s} {st.median(two):.0f} {unit} ({spread(two)}): "
                  f"{ratio(two, d):.2f}x 1 rank")
PY
