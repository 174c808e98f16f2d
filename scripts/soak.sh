#!/usr/bin/env bash
# Soak benchmark (README "Benchmarks", issue 7): 4 ranks over gRPC for 2000 steps
# (configs/smoke.yaml with a 512-1024-1024-4 MLP so a step takes a few ms, `dtrain launch --nproc
# 4`), sampling every rank's
# resident memory, thread count and open file descriptors once a second from /proc. Prints the
# samples at 20% of the run (after warm-up) and at the end, per rank, and the growth.
# Environment: STEPS (default 2000), NPROC (default 4), SET (extra --set arguments).
set -euo pipefail
cd "$(dirname "$0")/.."
STEPS=${STEPS:-2000}
NPROC=${NPROC:-4}
BIN=build/bin/dtrain
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
"$BIN" launch --nproc "$NPROC" configs/smoke.yaml --out "$out/run" --log-level warn \
  --set train.epochs=0 --set train.max_steps="$STEPS" --set train.log_every=100 \
  --set model.hidden=[1024,1024] --set data.synthetic.features=512 \
  --set data.synthetic.samples=50000 ${SET:-} >"$out/launch.log" 2>&1 &
launcher=$!
: >"$out/samples"
while kill -0 "$launcher" 2>/dev/null; do
  for pid in $(pgrep -f -- "run configs/smoke.yaml --out $out/run" || true); do
    [ -r "/proc/$pid/status" ] || continue
    rank=$(tr '\0' '\n' <"/proc/$pid/environ" 2>/dev/null | sed -n 's/^RANK=//p')
    rss=$(awk '/VmRSS/ {print $2}' "/proc/$pid/status" 2>/dev/null || true)
    thr=$(awk '/Threads/ {print $2}' "/proc/$pid/status" 2>/dev/null || true)
    fds=$(ls "/proc/$pid/fd" 2>/dev/null | wc -l)
    [ -n "$rank" ] && [ -n "$rss" ] && echo "$(date +%s.%N) $rank $rss $thr $fds" >>"$out/samples"
  done
  sleep 1
done
wait "$launcher" || { cat "$out/launch.log"; exit 1; }
python3 - "$out/samples" "$out/run/summary.json" <<'PY'
import json, sys
rows = [l.split() for l in open(sys.argv[1]) if l.strip()]
s = json.load(open(sys.argv[2]))
t0, t1 = float(rows[0][0]), float(rows[-1][0])
print(f"{s['steps']} steps, {s['world_size']} ranks, {t1 - t0:.0f} s sampled, "
      f"peak RSS rank 0 {s['peak_rss_mb']:.0f} MiB")
print(f"{'rank':>4} {'RSS@20% MiB':>12} {'RSS end MiB':>12} {'growth':>7} {'threads':>9} {'fds':>9}")
for r in sorted({row[1] for row in rows}, key=int):
    mine = [row for row in rows if row[1] == r]
    warm = [row for row in mine if float(row[0]) >= t0 + 0.2 * (t1 - t0)]
    a, b = warm[0], mine[-1]
    ra, rb = int(a[2]) / 1024, int(b[2]) / 1024
    print(f"{r:>4} {ra:12.1f} {rb:12.1f} {100 * (rb - ra) / ra:6.1f}% {a[3]:>4}->{b[3]:<4} "
          f"{a[4]:>4}->{b[4]:<4}")
PY
