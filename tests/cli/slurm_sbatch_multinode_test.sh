#!/usr/bin/env bash
# scripts/slurm.sbatch's wiring without a Slurm cluster: stand-in `srun` and `scontrol` on PATH
# record how the script calls them (the real-Slurm test lives with the engine tests).
#   1. per-node mode (DTRAIN_NPROC_PER_NODE=2, one node): srun runs one task, which runs
#      `dtrain launch --nnodes 1 --node-rank 0 --nproc-per-node 2 ...`; a real 2-rank job trains;
#   2. one rank per task (the default) calls `dtrain run CONFIG` as before;
#   3. a run that exits 75 (checkpointed for a preemption) is requeued with `scontrol requeue`,
#      and a requeued job with a checkpoint continues with --resume auto; exit 143 is not requeued.
# Usage: slurm_sbatch_multinode_test.sh DTRAIN_BIN REPO_ROOT
set -uo pipefail
bin=$(realpath "$1")
root=$2
script=$root/scripts/slurm.sbatch
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
fail() {
  echo "FAIL: $*"
  for f in "$work"/*.log "$work"/calls; do [ -f "$f" ] && { echo "--- $f"; cat "$f"; }; done
  exit 1
}
mkdir -p "$work/path"
# srun: record the call, drop the options, run the command once as the only task of node 0.
cat >"$work/path/srun" <<'SH'
#!/bin/bash
echo "srun $*" >>"$CALLS"
while [[ $# -gt 0 && $1 == --* ]]; do shift; done
SLURM_NNODES=1 SLURM_NODEID=0 SLURM_PROCID=0 SLURM_NTASKS=1 SLURM_LOCALID=0 "$@"
SH
cat >"$work/path/scontrol" <<'SH'
#!/bin/bash
if [[ $1 == show ]]; then echo 127.0.0.1; else echo "scontrol $*" >>"$CALLS"; fi
SH
# A dtrain that records its arguments and exits with $FAKE_RC.
cat >"$work/path/fake-dtrain" <<'SH'
#!/bin/bash
echo "dtrain $*" >>"$CALLS"
exit "$FAKE_RC"
SH
chmod +x "$work/path"/*
export CALLS=$work/calls PATH=$work/path:$PATH SLURM_JOB_NODELIST=localhost SLURM_JOB_NUM_NODES=1
cd "$work" || exit 1

# 1. Per-node mode, a real job.
SLURM_JOB_ID=11 SLURM_NNODES=1 SLURM_CPUS_PER_TASK=2 DTRAIN_NPROC_PER_NODE=2 DTRAIN_BIN=$bin \
  bash "$script" "$root/configs/smoke.yaml" --out "$work/pn" --log-level warn >"$work/pn.log" 2>&1 ||
  fail "per-node mode exited $?"
grep -q -- "srun --ntasks=1 --ntasks-per-node=1 --kill-on-bad-exit=1 --output=$work/pn/logs/launcher-%n.log bash -c" "$CALLS" ||
  fail "per-node mode: not one task per node"
grep -q '"world_size": 2' "$work/pn/summary.json" || fail "per-node mode: no 2-rank summary"
[ -f "$work/pn/logs/rank-1.log" ] || fail "per-node mode: no rank-1 log"
echo "PASS 1: per-node mode ran dtrain launch with 2 ranks"

# 2. One rank per task: `dtrain run` with the arguments, as before.
: >"$CALLS"
SLURM_JOB_ID=12 SLURM_NTASKS=1 FAKE_RC=0 DTRAIN_BIN=fake-dtrain bash "$script" cfg.yaml \
  --set a=b --out "$work/pr" >"$work/pr.log" 2>&1 || fail "per-rank mode exited $?"
grep -qx "dtrain run cfg.yaml --set a=b --out $work/pr" "$CALLS" || fail "per-rank mode: wrong command"
echo "PASS 2: one rank per task runs: $(grep '^dtrain' "$CALLS")"

# 3. Exit 75 is requeued (and the requeued run resumes); 143 is not.
: >"$CALLS"
mkdir -p "$work/rq/checkpoints" && touch "$work/rq/checkpoints/latest"
SLURM_JOB_ID=13 SLURM_NTASKS=1 SLURM_RESTART_COUNT=1 FAKE_RC=75 DTRAIN_BIN=fake-dtrain \
  bash "$script" cfg.yaml --out "$work/rq" >"$work/rq.log" 2>&1
rc=$?
[ $rc -eq 75 ] || fail "requeue: exit $rc, want 75"
grep -qx "dtrain run cfg.yaml --resume auto --out $work/rq" "$CALLS" || fail "requeue: no --resume auto"
grep -qx "scontrol requeue 13" "$CALLS" || fail "requeue: scontrol requeue not called"
: >"$CALLS"
SLURM_JOB_ID=14 SLURM_NTASKS=1 FAKE_RC=143 DTRAIN_BIN=fake-dtrain bash "$script" cfg.yaml \
  --out "$work/rq" >"$work/rq2.log" 2>&1
[ $? -eq 143 ] || fail "scancel: wrong exit"
grep -q "scontrol requeue" "$CALLS" && fail "exit 143 was requeued"
grep -q -- "--resume" "$CALLS" && fail "a first run (SLURM_RESTART_COUNT unset) resumed"
echo "PASS 3: exit 75 requeued and resumed with --resume auto; exit 143 not requeued"

# 4. A requeued job with no committed checkpoint (preempted, or requeued by Slurm, before the
# first): --resume auto all the same, or the folder the first run left is refused (exit 2).
: >"$CALLS"
mkdir -p "$work/rq0" && touch "$work/rq0/metrics.jsonl"
SLURM_JOB_ID=15 SLURM_NTASKS=1 SLURM_RESTART_COUNT=1 FAKE_RC=0 DTRAIN_BIN=fake-dtrain \
  bash "$script" cfg.yaml --out "$work/rq0" >"$work/rq0.log" 2>&1 || fail "requeue without a checkpoint exited $?"
grep -qx "dtrain run cfg.yaml --resume auto --out $work/rq0" "$CALLS" || fail "requeue without a checkpoint: no --resume auto"
grep -q "no checkpoint committed" "$work/rq0.log" || fail "requeue without a checkpoint: not said"
# A first run's --overwrite is not passed to its requeue (refused together with --resume).
: >"$CALLS"
SLURM_JOB_ID=16 SLURM_NTASKS=1 SLURM_RESTART_COUNT=2 FAKE_RC=0 DTRAIN_BIN=fake-dtrain \
  bash "$script" cfg.yaml --overwrite --out "$work/rq0" >"$work/rq1.log" 2>&1 || fail "requeue of an --overwrite job exited $?"
grep -qx "dtrain run cfg.yaml --resume auto --out $work/rq0" "$CALLS" || fail "requeue of an --overwrite job: $(cat "$CALLS")"
# Outside Slurm: a usage line, exit 2 (it was "SLURM_JOB_NODELIST: unbound variable").
out=$(env -u SLURM_JOB_ID -u SLURM_JOB_NODELIST bash "$script" cfg.yaml 2>&1)
[ $? -eq 2 ] || fail "outside Slurm: exit not 2: $out"
grep -q "not in a Slurm job" <<<"$out" || fail "outside Slurm: $out"
echo "PASS 4: a requeue without a checkpoint runs --resume auto; outside Slurm: a usage line"
