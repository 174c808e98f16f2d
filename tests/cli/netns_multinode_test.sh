#!/usr/bin/env bash
# Two "nodes" as two network namespaces joined by a veth pair, each running
# `dtrain launch --nnodes 2 --nproc-per-node 2` (4 ranks), as on two machines:
#   1. the job trains together and its parameters equal an in-process 4-rank run's, bitwise;
#   2. a rank killed on node 1 (DTRAIN_FAULT) makes node 0's launcher exit non-zero within
#      heartbeat_s + a few seconds (not the 60 s collective deadline), naming rank 3 and node 1;
#   3. with --max-restarts 1 the job recovers from its checkpoint on both nodes together (node
#      0 counts the restart) and ends bitwise equal to the uninterrupted run;
#   4. SIGTERM to node 0's launcher alone stops the ranks of both nodes (node 1's launcher
#      forwards it too), both launchers exit with the ranks' code (75, a preemption), and
#      `--resume auto` on both nodes ends bitwise equal to the uninterrupted run;
#   5. the same with the signal during a checkpoint save (DTRAIN_FAULT slow_save);
#   6. nodes that do not share the output folder: a ddp job's restart resumes every rank from
#      rank 0's checkpoint (node 1's launcher finds none in its own folder) and ends bitwise
#      equal; an fsdp job, whose shards would be split over the two folders, stops at its first
#      checkpoint with exit 2 and a message that names the shared folder it needs;
#   7. node 0 refusing its --out (it holds a run) refuses the job: both exit 2 at once;
#   8. a second SIGTERM to node 0's launcher while it waits for node 1's report ends it at once.
# The output folder is shared by the two nodes (one file system, as a PVC or NFS would be),
# except in 6.
# Needs root and iproute2; exits 77 (CTest: skipped) with the reason where namespaces cannot be
# made. Usage: netns_multinode_test.sh DTRAIN_BIN CONFIG
set -uo pipefail
bin=$1
config=$2
skip() {
  echo "SKIP: $*"
  exit 77
}
fail() {
  echo "FAIL: $*"
  for f in "$out"/*.log; do
    echo "--- $f"
    tail -n 40 "$f"
  done
  exit 1
}
[ "$(id -u)" -eq 0 ] || skip "needs root to create network namespaces (ip netns add)"
command -v ip >/dev/null || skip "iproute2 (the ip command) is not installed"

tag=$$
ns0=dtrain-mn0-$tag
ns1=dtrain-mn1-$tag
veth0=dma$tag
veth1=dmb$tag
# Addresses inside our own namespaces only; nothing outside them is ever contacted.
sub=$((tag % 200 + 20))
addr0=10.214.$sub.1
addr1=10.214.$sub.2
out=$(mktemp -d)
echo "work folder: $out"
cleanup() {
  ip netns del "$ns0" 2>/dev/null
  ip netns del "$ns1" 2>/dev/null
  [ -n "${DTRAIN_TEST_KEEP:-}" ] || rm -rf "$out"
}
trap cleanup EXIT
ip netns add "$ns0" 2>/dev/null || skip "ip netns add is not permitted here (no CAP_SYS_ADMIN or no netns support)"
ip netns add "$ns1" || skip "ip netns add failed for the second namespace"
ip link add "$veth0" type veth peer name "$veth1" || skip "cannot create a veth pair"
ip link set "$veth0" netns "$ns0" && ip link set "$veth1" netns "$ns1" || exit 1
ip -n "$ns0" addr add "$addr0/24" dev "$veth0" && ip -n "$ns1" addr add "$addr1/24" dev "$veth1" || exit 1
for ns in "$ns0" "$ns1"; do ip -n "$ns" link set lo up || exit 1; done
ip -n "$ns0" link set "$veth0" up && ip -n "$ns1" link set "$veth1" up || exit 1

# The tensor bytes of a safetensors file: everything after the 8-byte header length and the
# JSON header (whose metadata names the backend, so the files differ there).
tensor_bytes() {
  local n
  n=$(od -An -t u8 -N8 "$1" | tr -d ' ')
  tail -c +$((8 + n + 1)) "$1"
}
same_tensors() {
  [ -f "$1" ] || fail "no checkpoint $1"
  [ -f "$2" ] || fail "no checkpoint $2"
  cmp -s <(tensor_bytes "$1") <(tensor_bytes "$2")
}

sets=(--set train.checkpoint.every_steps=10 --set distributed.rendezvous_timeout_s=30
  --set distributed.heartbeat_s=5 --set distributed.timeout_s=60 --log-level info)
# Runs one job: launcher 0 in ns0, launcher 1 in ns1, in the background; waits for both.
# Usage: job NAME PORT [extra launch args...]; sets rc0, rc1, secs0 (launcher 0's run time).
# With WHILE_RUNNING set, runs that command (with $p0 and $p1 set) before waiting.
job() {
  local name=$1 port=$2
  shift 2
  local common=(--nnodes 2 --nproc-per-node 2 --master-addr "$addr0" --master-port "$port"
    "${sets[@]}" "$@")
  # NODE1_OUT: node 1's own output folder (nodes that do not share one), else the shared one.
  local out1=${NODE1_OUT:-$out/$name}
  local start
  start=$(date +%s%N)
  ip netns exec "$ns0" env DTRAIN_JOB_TOKEN="mn-$tag" ${FAULT:+DTRAIN_FAULT=$FAULT} \
    "$bin" launch "$config" --node-rank 0 --set distributed.bind="$addr0" --out "$out/$name" "${common[@]}" \
    >"$out/$name-$port-node0.log" 2>&1 &
  local p0=$!
  ip netns exec "$ns1" env DTRAIN_JOB_TOKEN="mn-$tag" ${FAULT:+DTRAIN_FAULT=$FAULT} \
    "$bin" launch "$config" --node-rank 1 --set distributed.bind="$addr1" --out "$out1" "${common[@]}" \
    >"$out/$name-$port-node1.log" 2>&1 &
  local p1=$!
  [ -n "${WHILE_RUNNING:-}" ] && eval "$WHILE_RUNNING"
  wait $p0
  rc0=$?
  secs0=$((($(date +%s%N) - start) / 1000000000))
  wait $p1
  rc1=$?
}

# The reference: 4 ranks as threads in one process.
"$bin" run "$config" --set distributed.world_size=4 --set train.checkpoint.every_steps=10 \
  --out "$out/inproc" --log-level warn >"$out/inproc.log" 2>&1 || fail "in-process run failed"
final=$(basename "$(ls "$out"/inproc/checkpoints/step-*.safetensors | sort -t- -k2 -n | tail -n1)")

# 1. Together.
FAULT='' job together 29500
[ $rc0 -eq 0 ] && [ $rc1 -eq 0 ] || fail "together: launcher exits $rc0 and $rc1"
grep -q '"world_size": 4' "$out/together/summary.json" || fail "together: no 4-rank summary"
same_tensors "$out/together/checkpoints/$final" "$out/inproc/checkpoints/$final" ||
  fail "together: parameters differ from the in-process 4-rank run"
echo "PASS 1: 2 nodes x 2 ranks trained together, $final bitwise equal to in-process 4 ranks"

# 2. Rank 3 (node 1) killed at step 25; training slowed to 0.1 s per step so that the job is
# still running then, and a hang would show as the 60 s deadline.
FAULT='kill:rank=3:step=25,delay:rank=0:ms=100' job killed 29510
[ $rc0 -ne 0 ] || fail "killed: node 0's launcher exited 0"
[ $rc1 -ne 0 ] || fail "killed: node 1's launcher exited 0"
grep -q 'rank 3 on node 1 .* failed: killed by signal SIGKILL' "$out/killed-29510-node0.log" ||
  fail "killed: node 0's launcher does not name rank 3 on node 1"
# Start-up and 25 steps take about 4 s; heartbeat_s is 5.
[ "$secs0" -lt 20 ] || fail "killed: node 0's launcher took $secs0 s"
echo "PASS 2: node 0's launcher exited $rc0 after $secs0 s naming: $(grep -o 'rank 3 on node 1[^;]*SIGKILL' "$out/killed-29510-node0.log" | head -n1)"

# 3. The same kill with a restart: both nodes restart together and finish equal.
FAULT='kill:rank=3:step=25' job restarted 29520 --max-restarts 1
[ $rc0 -eq 0 ] && [ $rc1 -eq 0 ] || fail "restarted: launcher exits $rc0 and $rc1"
grep -q "restart 1 of 1 (node 0's count)" "$out/restarted-29520-node0.log" || fail "restarted: node 0 did not restart"
grep -q "restart 1 of 1 (node 0's count)" "$out/restarted-29520-node1.log" || fail "restarted: node 1 did not restart"
same_tensors "$out/restarted/checkpoints/$final" "$out/inproc/checkpoints/$final" ||
  fail "restarted: parameters differ from the uninterrupted run"
echo "PASS 3: restarted once on both nodes, $final bitwise equal to the uninterrupted run"

# 4. SIGTERM to node 0's launcher once training is under way (0.1 s per step).
# shellcheck disable=SC2034  # read by WHILE_RUNNING, eval-ed in job
metrics=$out/stopped/metrics.jsonl
FAULT='delay:rank=0:ms=100' WHILE_RUNNING='for i in $(seq 300); do [ -s "$metrics" ] && break; sleep 0.1; done; kill -TERM $p0' \
  job stopped 29530
[ $rc0 -eq 75 ] && [ $rc1 -eq 75 ] ||
  fail "stopped: launcher exits $rc0 and $rc1 (want 75 on both: the ranks' preemption code)"
grep -q "another node's launcher received SIGTERM: forwarding it to the ranks" "$out/stopped-29530-node1.log" ||
  fail "stopped: node 1 did not hear of node 0's signal"
[ -e "$out/stopped/checkpoints/latest" ] || fail "stopped: no checkpoint"
stop_rc=$rc0
FAULT='' job stopped 29540 --resume auto
[ $rc0 -eq 0 ] && [ $rc1 -eq 0 ] || fail "resumed: launcher exits $rc0 and $rc1"
same_tensors "$out/stopped/checkpoints/$final" "$out/inproc/checkpoints/$final" ||
  fail "resumed: parameters differ from the uninterrupted run"
echo "PASS 4: SIGTERM to node 0's launcher stopped both nodes (each exited $stop_rc, the ranks' code); resumed, $final bitwise equal"

# 5. SIGTERM to node 0's launcher while a checkpoint is being written: rank 0 holds every
# checkpoint write 2 s (DTRAIN_FAULT slow_save) and the signal comes during the save of step 10.
# That save completes, every rank of both nodes stops after step 11 and exits 75, the checkpoint
# of step 11 is the newest, and `--resume auto` on both nodes ends bitwise equal.
# shellcheck disable=SC2034  # read by WHILE_RUNNING, eval-ed in job
saving_log=$out/saving/logs/rank-0.log
FAULT='slow_save:rank=0:ms=2000' WHILE_RUNNING='for i in $(seq 300); do grep -qs "in the checkpoint of step 10" "$saving_log" && break; sleep 0.1; done; kill -TERM $p0' \
  job saving 29550
[ $rc0 -eq 75 ] && [ $rc1 -eq 75 ] || fail "saving: launcher exits $rc0 and $rc1 (want 75 on both)"
grep -q "preempted at step 11 " "$out/saving-29550-node0.log" || fail "saving: the job did not stop after step 11"
grep -q "step-11" "$out/saving/checkpoints/latest" || fail "saving: latest is $(cat "$out/saving/checkpoints/latest")"
FAULT='' job saving 29560 --resume auto
[ $rc0 -eq 0 ] && [ $rc1 -eq 0 ] || fail "saving resumed: launcher exits $rc0 and $rc1"
same_tensors "$out/saving/checkpoints/$final" "$out/inproc/checkpoints/$final" ||
  fail "saving resumed: parameters differ from the uninterrupted run"
echo "PASS 5: SIGTERM to node 0's launcher during a checkpoint save: both nodes stopped after step 11 (exit 75), resumed, $final bitwise equal"

# 6. Nodes that do not share --out (each its own folder, as on two machines' local disks).
FAULT='kill:rank=3:step=25' NODE1_OUT=$out/unshared-node1 job unshared 29570 --max-restarts 1
[ $rc0 -eq 0 ] && [ $rc1 -eq 0 ] || fail "unshared ddp: launcher exits $rc0 and $rc1"
grep -q "rank 0 resumes and this rank was started without --resume" "$out/unshared-node1/logs/rank-2.log" ||
  fail "unshared ddp: rank 2 did not follow rank 0's resume"
same_tensors "$out/unshared/checkpoints/$final" "$out/inproc/checkpoints/$final" ||
  fail "unshared ddp: parameters differ from the uninterrupted run"
FAULT='' NODE1_OUT=$out/unshared-fsdp-node1 job unshared-fsdp 29580 --set distributed.strategy=fsdp
[ $rc0 -eq 2 ] && [ $rc1 -eq 2 ] || fail "unshared fsdp: launcher exits $rc0 and $rc1 (want 2 on both)"
grep -q "the ranks do not share the output folder" "$out/unshared-fsdp-29580-node0.log" ||
  fail "unshared fsdp: node 0 does not say why"
grep -q "rank 0 aborted: checkpoint .*do not share the output folder" "$out/unshared-fsdp-29580-node1.log" ||
  fail "unshared fsdp: node 1's ranks do not relay rank 0's reason"
echo "PASS 6: without a shared --out, ddp restarted from rank 0's checkpoint ($final bitwise equal); fsdp stopped at its first checkpoint (exit 2) naming the shared folder"

# 7. Node 0's --out already holds a run (1.'s) and no --overwrite: node 0 alone checks the
# folder, so it refuses the job at node 1's check-in. Both exit 2 at once, node 1 naming node 0's
# reason (it waited out its 300 s join timeout for a node 0 that had exited, then exited 1).
FAULT='' job together 29590
[ $rc0 -eq 2 ] && [ $rc1 -eq 2 ] || fail "refused: launcher exits $rc0 and $rc1 (want 2 on both)"
[ "$secs0" -lt 20 ] || fail "refused: node 0's launcher took $secs0 s"
grep -q "node 0 refused this job: output folder .* already holds a run" "$out/together-29590-node1.log" ||
  fail "refused: node 1 does not give node 0's reason"
echo "PASS 7: node 0 refused its --out (a run there); both launchers exited 2 within $secs0 s, node 1 naming the reason"

# 8. Node 1's launcher is frozen (SIGSTOP) once training is under way, then node 0's launcher gets
# SIGTERM: the ranks of both nodes agree to stop and exit 75, and node 0's launcher waits for node
# 1's report until it counts node 1 as lost (10 s of silence). A second SIGTERM ends it at once,
# with the preemption code. (SIGINT cannot be used here: a script's background jobs ignore it.)
# shellcheck disable=SC2034  # read by WHILE_RUNNING, eval-ed in job
metrics=$out/second/metrics.jsonl
# shellcheck disable=SC2016  # expanded in job
FAULT='delay:rank=0:ms=100' WHILE_RUNNING='
  for i in $(seq 300); do [ -s "$metrics" ] && break; sleep 0.1; done
  kill -STOP $p1; kill -TERM $p0
  for i in $(seq 300); do grep -qs "waiting up to .* for the other nodes" "$out/second-29600-node0.log" && break; sleep 0.1; done
  sleep 1; t8=$(date +%s%N); kill -TERM $p0; wait $p0; rc8=$?; ms8=$((($(date +%s%N) - t8) / 1000000))
  kill -CONT $p1' \
  job second 29600
grep -q "waiting up to .* for the other nodes" "$out/second-29600-node0.log" ||
  fail "second: node 0's launcher never waited for node 1's report"
[ "$rc8" -eq 75 ] || fail "second: node 0's launcher exited $rc8 after the second SIGTERM (want 75)"
[ "$ms8" -lt 3000 ] || fail "second: node 0's launcher took $ms8 ms after the second SIGTERM"
echo "PASS 8: a second SIGTERM to node 0's launcher waiting for node 1's report ended it in $ms8 ms (exit 75); node 1 exited $rc1"
