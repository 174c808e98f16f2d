#!/usr/bin/env bash
# cnn-ref's convolutions and poolings, 1 thread, batch 128: dtrain's kernels (build/bin/conv_bench:
# per im2col chunk, against the same GEMMs alone) next to PyTorch's F.conv2d / F.max_pool2d
# forward + backward on the same shapes (when python3-torch is installed; PyTorch runs its own
# oneDNN kernels). Both sides time thread CPU time, so other jobs on a shared machine slow the
# figures less than wall time would (they still share caches and cores). Alternates REPS times and
# prints each sample, then the medians and PyTorch's time over dtrain's as the median of the
# per-repetition ratios with their range.
#
#   scripts/bench_conv.sh            # REPS=3 PEER=1
#   REPS=5 PEER=0 scripts/bench_conv.sh
set -euo pipefail
cd "$(dirname "$0")/.."
REPS=${REPS:-3}
PEER=${PEER:-1}
BIN=${BIN:-build/bin/conv_bench}
if [ "$PEER" = 1 ] && ! /usr/bin/python3 -c 'import torch' 2>/dev/null; then
  echo "no python3-torch: the PyTorch side is skipped (PEER=0)"
  PEER=0
fi
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
cat >"$out/peer_convs.py" <<'PY'
import time, torch, torch.nn.functional as F
torch.set_num_threads(1)
B = 128
x1 = torch.rand(B, 1, 28, 28)  # the first conv needs no input gradient, as in training
w1, b1 = torch.rand(32, 1, 3, 3, requires_grad=True), torch.rand(32, requires_grad=True)
x2 = torch.rand(B, 32, 14, 14, requires_grad=True)
w2, b2 = torch.rand(64, 32, 3, 3, requires_grad=True), torch.rand(64, requires_grad=True)
g1, g2 = torch.rand(B, 32, 28, 28), torch.rand(B, 64, 14, 14)
p1 = torch.rand(B, 32, 28, 28, requires_grad=True)
p2 = torch.rand(B, 64, 14, 14, requires_grad=True)
h1, h2 = torch.rand(B, 32, 14, 14), torch.rand(B, 64, 7, 7)
def convs():
    torch.autograd.backward([F.conv2d(x1, w1, b1, padding=1), F.conv2d(x2, w2, b2, padding=1)], [g1, g2])
def pools():
    torch.autograd.backward([F.max_pool2d(p1, 2), F.max_pool2d(p2, 2)], [h1, h2])
def median_ms(f, iters=10):
    f()
    t = []
    for _ in range(iters):
        t0 = time.thread_time(); f(); t.append(time.thread_time() - t0)
    return sorted(t)[len(t) // 2] * 1e3
print(f"{median_ms(convs):.2f} {median_ms(pools):.2f}")
PY
json() { python3 -c 'import json,sys; d=json.loads(sys.stdin.read().splitlines()[-1]); print(eval(sys.argv[1]))' "$1"; }
echo "$(date -u +%FT%TZ) $(nproc) cores, load $(cut -d' ' -f1-3 /proc/loadavg), $REPS repetitions"
: >"$out/d"; : >"$out/g"; : >"$out/p"; : >"$out/t"; : >"$out/tp"; : >"$out/r"; : >"$out/rp"
for i in $(seq "$REPS"); do
  j=$("$BIN" --rounds 1 --iters 10 --chunks 1,128)
  d=$(json 'd["chunks"][0]["kernels_ms"]' <<<"$j")
  g=$(json 'd["chunks"][0]["gemm_ms"]' <<<"$j")
  w=$(json 'd["chunks"][1]["kernels_ms"]' <<<"$j")
  p=$(json 'd["pool_ms"]' <<<"$j")
  line="rep $i: dtrain convs $d ms (whole-batch im2col $w ms), their GEMMs alone $g ms, max-pools $p ms"
  echo "$d" >>"$out/d"; echo "$g" >>"$out/g"; echo "$p" >>"$out/p"
  if [ "$PEER" = 1 ]; then
    read -r t tp < <(/usr/bin/python3 "$out/peer_convs.py")
    line="$line; torch convs $t ms, max-pools $tp ms"
    echo "$t" >>"$out/t"; echo "$tp" >>"$out/tp"
    python3 -c "print($t / $d)" >>"$out/r"; python3 -c "print($tp / $p)" >>"$out/rp"
  fi
  echo "$line"
done
med() { sort -g "$1" | awk '{a[NR]=$1} END {print a[int((NR+1)/2)]}'; }
d=$(med "$out/d"); g=$(med "$out/g"); p=$(med "$out/p")
summary="median: dtrain convs $d ms, GEMMs alone $g ms ($(python3 -c "print(round(100*$g/$d))")% of the convs' time), max-pools $p ms"
if [ "$PEER" = 1 ]; then
  t=$(med "$out/t"); tp=$(med "$out/tp")
  r=$(med "$out/r"); rp=$(med "$out/rp")
  summary="$summary; torch convs $t ms, max-pools $tp ms; torch / dtrain time (median of the per-repetition ratios, so a load change between repetitions cancels): convs $(python3 -c "print(round($r, 2))")x (from $(sort -g "$out/r" | head -1 | cut -c1-4) to $(sort -g "$out/r" | tail -1 | cut -c1-4)), max-pools $(python3 -c "print(round($rp, 2))")x"
fi
echo "$summary"
