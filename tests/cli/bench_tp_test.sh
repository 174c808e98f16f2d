#!/usr/bin/env bash
# `dtrain bench tp` on a tiny GPT (2 blocks of width 32, 8 heads, 16 positions, batch 2, dropout
# 0.1) at T = 2 and 4: one well-formed JSON object per size; the measured regions add up to no
# more than the step they are part of, within scheduling noise (each is the median of its own
# timed loop);
# the step issues 4 all-reduces of [B S, C] per block (none for the tied head's gradient); the
# replicated activation bytes sequence parallelism would split, found from two tensor sizes,
# equal what the layers save (per block 4 [B S, C] tensors, its output and 2 dropout masks, 2
# LayerNorms' [B S, 2]; the embedding's output, mask and [B S] token ids; ln_f's output and
# [B S, 2]); the same with 6 heads, whose blocks' second size is 3 (neither 2T nor T/2 splits them:
# the replicated bytes were left out). Bad --tp: exit 2, before any size is measured; a batch
# this machine cannot hold: exit 2 (it was a failed allocation, exit 1). Skipped (77) without
# python3.
set -euo pipefail
BIN=$1 SRC=$2
command -v python3 >/dev/null || { echo "skip: python3 is not installed"; exit 77; }
sets=(--set model.n_layer=2 --set model.n_head=8 --set model.n_embd=32 --set model.block_size=16
      --set data.batch_size=2 --set model.dropout=0.1)
out=$("$BIN" bench tp "$SRC/configs/gpt_tp_bench.yaml" "${sets[@]}" --tp 2,4 --iters 9 --json)
echo "$out"
python3 - "$out" <<'PY'
import json, math, sys
lines = [l for l in sys.argv[1].splitlines() if l.strip()]
assert len(lines) == 2, lines
B, S, C, L = 2, 16, 32, 2
want_repl = 4 * (L * (7 * B * S * C + 4 * B * S) + (2 * B * S * C + B * S) + (B * S * C + 2 * B * S))
for line, t in zip(lines, (2, 4)):
    r = json.loads(line)
    assert r["tp"] == t and (r["batch"], r["seq"], r["embd"], r["layers"]) == (B, S, C, L), r
    for k in ("step_ms", "ln_ms", "resid_ms", "dropout_ms", "head_gemm_ms", "ce_ms", "emb_ms",
              "ar_ms", "rs_ms", "ag_ms", "ar_rows_ms"):
        assert math.isfinite(r[k]) and r[k] > 0, (k, r[k])
    parts = r["ln_ms"] + r["resid_ms"] + r["dropout_ms"] + r["head_gemm_ms"] + r["ce_ms"] + r["emb_ms"]
    assert abs(parts - r["parts_ms"]) <= 1e-3 * parts + 1e-3, (parts, r["parts_ms"])
    # Each region is a median of its own timed loop: their sum may exceed the step's median by
    # scheduling noise (tp ranks as threads on 2 cores), not by a whole step.
    assert r["parts_ms"] <= 1.25 * r["step_ms"] + 0.05, ("parts exceed the step", r["parts_ms"], r["step_ms"])
    assert r["step_allreduces"] == 4 * L, r["step_allreduces"]
    assert r["step_allreduce_floats"] == 4 * L * B * S * C, r["step_allreduce_floats"]
    assert r["sp_split_bytes"] == want_repl, (r["sp_split_bytes"], want_repl)
    assert 0 < r["sp_split_bytes"] < r["act_bytes"], r
    assert r["head_act_bytes"] == B * S * 256 * 4, r["head_act_bytes"]
    assert abs(r["sp_act_bytes_saved"] - (t - 1) / t * want_repl) < 1, r["sp_act_bytes_saved"]
print("ok")
PY
set +e
"$BIN" bench tp "$SRC/configs/gpt_tp_bench.yaml" "${sets[@]}" --tp 3 --iters 1 2>"${TMPDIR:-/tmp}/bench_tp_err.$$"
code=$?
set -e
err=$(cat "${TMPDIR:-/tmp}/bench_tp_err.$$")
rm -f "${TMPDIR:-/tmp}/bench_tp_err.$$"
echo "$err"
[ "$code" = 2 ] || { echo "--tp 3: exit $code, want 2"; exit 1; }
grep -q -- "--tp 3" <<<"$err"
echo ok
# An empty or malformed list is named as typed (it was "--tp 0", or ran without the empty size).
for bad in '' '2,,4' 'x'; do
  set +e
  err=$("$BIN" bench tp "$SRC/configs/gpt_tp_bench.yaml" "${sets[@]}" --tp "$bad" --iters 1 2>&1)
  code=$?
  set -e
  [ "$code" = 2 ] || { echo "--tp '$bad': exit $code, want 2: $err"; exit 1; }
  grep -q -- "--tp '$bad': " <<<"$err" || { echo "--tp '$bad': $err"; exit 1; }
done
echo ok
# 6 heads of width 8 at T = 2: the blocks' bytes decomposed with T = 3.
out=$("$BIN" bench tp "$SRC/configs/gpt_tp_bench.yaml" "${sets[@]}" --set model.n_head=6 \
  --set model.n_embd=48 --tp 2 --iters 1 --json)
python3 - "$out" <<'PY'
import json, sys
r = json.loads(sys.argv[1])
B, S, C, L = 2, 16, 48, 2
want = 4 * (L * (7 * B * S * C + 4 * B * S) + (2 * B * S * C + B * S) + (B * S * C + 2 * B * S))
assert r["other_tp"] == 3, r["other_tp"]
assert r["sp_split_bytes"] == want, (r["sp_split_bytes"], want)
PY
echo ok
# A bad size after a good one: refused before T = 2 runs (nothing on stdout).
set +e
got=$("$BIN" bench tp "$SRC/configs/gpt_tp_bench.yaml" "${sets[@]}" --tp 2,3 --iters 1 --json 2>/dev/null)
code=$?
set -e
[ "$code" = 2 ] && [ -z "$got" ] || { echo "--tp 2,3: exit $code, output '$got'"; exit 1; }
# A batch of 100000 windows of 256 positions: refused by the memory check.
set +e
err=$("$BIN" bench tp "$SRC/configs/gpt_tp_bench.yaml" --set data.batch_size=100000 --tp 2 --iters 1 2>&1)
code=$?
set -e
[ "$code" = 2 ] || { echo "batch 100000: exit $code, want 2: $err"; exit 1; }
grep -q "bench tp: --tp 2 would not fit, by dtrain run.s estimate.*more than the .* this process can allocate" <<<"$err" || { echo "$err"; exit 1; }
echo ok
