#!/usr/bin/env bash
# Measures what sequence parallelism and a vocabulary-parallel embedding/head could save on the
# tensor-parallel GPT step (README "Tensor parallelism", issue 14): `dtrain bench tp` times the
# step's regions on T in-process tensor ranks, then `dtrain bench comm --backend grpc` times the
# same collectives between processes over shared memory, and the savings are printed with
# either transport's collective times.
#
#   scripts/bench_tp_regions.sh [CONFIG [--set KEY=VALUE ...]]   # default configs/gpt_tp_bench.yaml
#
# Environment: DTRAIN (default build/bin/dtrain), TPS (default 2,4), ITERS (default 5), OUT
# (folder for the raw JSON, default a temp folder, kept).
set -euo pipefail
cd "$(dirname "$0")/.."
BIN=${DTRAIN:-build/bin/dtrain}
CONFIG=${1:-configs/gpt_tp_bench.yaml}
shift || true
TPS=${TPS:-2,4}
ITERS=${ITERS:-5}
OUT=${OUT:-$(mktemp -d /tmp/bench_tp_regions.XXXXXX)}
mkdir -p "$OUT"
command -v python3 >/dev/null || { echo "bench_tp_regions: needs python3" >&2; exit 2; }

echo "# $(date -u +%FT%TZ) load: $(cut -d' ' -f1-3 /proc/loadavg); raw JSON in $OUT" >&2
"$BIN" bench tp "$CONFIG" --tp "$TPS" --iters "$ITERS" --json "$@" | tee "$OUT/regions.jsonl"

# The [B S, C] and [B S] float tensors' sizes in bytes, from the first line.
read -r big small < <(python3 -c '
import json, sys
r = json.loads(open(sys.argv[1]).readline())
print(r["batch"] * r["seq"] * r["embd"] * 4, r["batch"] * r["seq"] * 4)' "$OUT/regions.jsonl")
: >"$OUT/shm.jsonl"
for t in ${TPS//,/ }; do
  for op in allreduce reduce_scatter allgather; do
    "$BIN" bench comm --backend grpc --nproc "$t" --op "$op" --sizes "$big,$small" \
      --iters "$((ITERS < 5 ? 5 : ITERS))" --json | grep '^{' >>"$OUT/shm.jsonl"
  done
done

python3 - "$OUT/regions.jsonl" "$OUT/shm.jsonl" <<'PY'
import json, sys
regions = [json.loads(l) for l in open(sys.argv[1]) if l.startswith("{")]
shm = {}
for l in open(sys.argv[2]):
    c = json.loads(l)
    shm[(c["world_size"], c["op"], c["bytes"])] = c["time_s"] * 1e3

def savings(r, ar, rs, ag, ar_rows):
    t = r["tp"]
    sp = (t - 1) / t * r["a_ms"] - r["step_allreduces"] * (rs + ag - ar)
    vp = (t - 1) / t * (r["head_gemm_ms"] + r["ce_ms"]) - (2 * ar + 3 * ar_rows)
    return sp, vp

print("\n| T | step ms | (a) ms | head GEMMs ms | xent ms | transport | AR ms | RS+AG ms "
      "| SP saving (share of step) | VP saving (share of step) | SP activation MB saved/rank |")
print("| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |")
for r in regions:
    t, big, small = r["tp"], r["batch"] * r["seq"] * r["embd"] * 4, r["batch"] * r["seq"] * 4
    rows = [("in-process", r["ar_ms"], r["rs_ms"], r["ag_ms"], r["ar_rows_ms"])]
    if (t, "allreduce", big) in shm:
        rows.append(("shm", shm[(t, "allreduce", big)], shm[(t, "reduce_scatter", big)],
                     shm[(t, "allgather", big)], shm[(t, "allreduce", small)]))
    for name, ar, rs, ag, arr in rows:
        sp, vp = savings(r, ar, rs, ag, arr)
        print(f"| {t} | {r['step_ms']:.1f} | {r['a_ms']:.1f} | {r['head_gemm_ms']:.1f} "
              f"| {r['ce_ms']:.1f} | {name} | {ar:.2f} | {rs + ag:.2f} "
              f"| {sp:.1f} ms ({100 * sp / r['step_ms']:.1f}%) "
              f"| {vp:.1f} ms ({100 * vp / r['step_ms']:.1f}%) "
              f"| {r['sp_act_bytes_saved'] / 1e6:.1f} of {r['act_bytes'] / 1e6:.1f} |")
PY
