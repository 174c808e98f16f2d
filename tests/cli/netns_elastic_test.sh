#!/usr/bin/env bash
# Elastic node count across two "nodes" (two network namespaces joined by a veth pair), each
# running `dtrain launch --nnodes 1:2 --nproc-per-node 2 --max-restarts 1` (4 ranks):
#   1. node 1's launcher is SIGKILLed mid-run (its machine is lost); node 0's launcher notices
#      (not heard from for 10 s), stops its ranks, and restarts alone: 2 ranks, node rank 0,
#      resumed from the sharded checkpoint (fsdp), the global batch kept (4 x 32 = 2 x 64);
#   2. a rank of node 1 is killed from outside (an OOM kill): node 0 drops node 1 (its launcher
#      exits 1, saying so) and restarts alone the same way;
#   3. node 0 alone: after the last call it starts on its 2 ranks, the global batch kept.
# Each time node 0 finishes (exit 0), its summary says world_size 2, its config keeps the global
# batch, and the log says what changed.
# The output folder is shared by the two nodes. Needs root and iproute2; exits 77 (CTest:
# skipped) with the reason where namespaces cannot be made.
# Usage: netns_elastic_test.sh DTRAIN_BIN CONFIG
set -uo pipefail
bin=$1
config=$2
skip() {
  echo "SKIP: $*"
  exit 77
}
fail() {
  echo "FAIL: $*"
  for f in "$out"/*.log "$out"/*/logs/*.log; do
    [ -f "$f" ] || continue
    echo "--- $f"
    tail -n 40 "$f"
  done
  exit 1
}
[ "$(id -u)" -eq 0 ] || skip "needs root to create network namespaces (ip netns add)"
command -v ip >/dev/null || skip "iproute2 (the ip command) is not installed"
command -v python3 >/dev/null || skip "python3 (to read summary.json) is not installed"

tag=$$
ns0=dtrain-el0-$tag
ns1=dtrain-el1-$tag
veth0=dea$tag
veth1=deb$tag
# Addresses inside our own namespaces only; nothing outside them is ever contacted.
sub=$((tag % 200 + 20))
addr0=10.215.$sub.1
addr1=10.215.$sub.2
out=$(mktemp -d)
echo "work folder: $out"
# Kills what runs in a namespace (the lost node's ranks outlive its launcher), then removes it.
drop_ns() {
  local pids
  pids=$(ip netns pids "$1" 2>/dev/null)
  # shellcheck disable=SC2086  # a list of pids
  [ -n "$pids" ] && kill -KILL $pids 2>/dev/null
  ip netns del "$1" 2>/dev/null
}
cleanup() {
  drop_ns "$ns0"
  drop_ns "$ns1"
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

# Starts one job's two launchers (node 0 in ns0, node 1 in ns1) in the background: sets p0, p1.
# Usage: start NAME PORT NODE0_FAULT NODE1_FAULT.
start() {
  local name=$1 port=$2
  local common=(--nnodes 1:2 --nproc-per-node 2 --master-addr "$addr0" --master-port "$port"
    --max-restarts 1 --last-call 3 --out "$out/$name" --set train.epochs=6
    --set distributed.strategy=fsdp
    --set train.checkpoint.every_steps=10 --set distributed.rendezvous_timeout_s=30
    --set distributed.heartbeat_s=5 --set distributed.timeout_s=60 --log-level info)
  ip netns exec "$ns0" env DTRAIN_JOB_TOKEN="el-$tag" ${3:+DTRAIN_FAULT=$3} \
    "$bin" launch "$config" --node-rank 0 --set distributed.bind="$addr0" "${common[@]}" \
    >"$out/$name-node0.log" 2>&1 &
  p0=$!
  ip netns exec "$ns1" env DTRAIN_JOB_TOKEN="el-$tag" ${4:+DTRAIN_FAULT=$4} \
    "$bin" launch "$config" --node-rank 1 --set distributed.bind="$addr1" "${common[@]}" \
    >"$out/$name-node1.log" 2>&1 &
  p1=$!
}
# Node 0 finished alone after a restart: the log says what changed, the summary and the config
# show 2 ranks with the global batch kept. Usage: check_alone NAME.
check_alone() {
  local log=$out/$1-node0.log
  grep -q "restart 1 of 1 (node 0's count)" "$log" || fail "$1: node 0 did not restart"
  grep -q "elastic restart 1: 1 node(s) instead of 2 (node(s) 1 left), 2 rank(s) instead of 4" \
    "$log" || fail "$1: the log does not say which node left"
  grep -q "global batch 128 kept: data.batch_size 32 -> 64" "$log" ||
    fail "$1: the log does not say how the global batch was kept"
  python3 - "$out/$1" <<'EOF' || fail "$1: summary or config wrong"
import json, sys
d = sys.argv[1]
s = json.load(open(d + "/summary.json"))
c = json.load(open(d + "/config.json"))
assert s["status"] == "completed", s["status"]
assert s["world_size"] == 2, s["world_size"]
assert s.get("resumed_from"), "not resumed"
g = c["data"]["batch_size"] * c["distributed"]["world_size"] * c["train"]["grad_accum_steps"]
assert c["data"]["batch_size"] == 64 and g == 128, (c["data"]["batch_size"], g)
print("summary: world_size", s["world_size"], "resumed from", s["resumed_from"],
      "global batch", g)
EOF
}
# The lost launcher's ranks outlive it (own process groups); they must not meet the next job.
kill_ns1_processes() {
  local pids
  pids=$(ip netns pids "$ns1")
  # shellcheck disable=SC2086  # a list of pids
  [ -n "$pids" ] && kill -KILL $pids 2>/dev/null
}

# 1. Node 1's launcher dies once training is under way (metrics written). 6 epochs of 0.15 s
# steps (first attempt only: faults do not fire in restarts) keep the job running well past the
# kill and the 10 s it takes to notice it.
start lost 29600 'delay:rank=0:ms=150' ''
for _ in $(seq 300); do [ -s "$out/lost/metrics.jsonl" ] && break; sleep 0.1; done
[ -s "$out/lost/metrics.jsonl" ] || fail "lost: the job did not start training"
grep -q "2 of at most 2 nodes checked in" "$out/lost-node0.log" ||
  fail "lost: node 0 did not start with both nodes"
kill -KILL $p1
wait $p1 2>/dev/null
wait $p0
rc0=$?
[ $rc0 -eq 0 ] || fail "lost: node 0's launcher exited $rc0 after node 1 was lost (want 0: restarted alone)"
grep -q "node 1's launcher was lost" "$out/lost-node0.log" || fail "lost: node 0 does not say node 1 was lost"
check_alone lost
kill_ns1_processes
echo "PASS 1: node 1's launcher lost; node 0 restarted alone on 2 ranks, global batch 128 kept, finished"

# 2. Rank 3 (on node 1) is killed from outside (SIGKILL) at step 25: node 1 is dropped and told
# so (exit 1), node 0 restarts alone from step 20's checkpoint and finishes.
start killed 29610 '' 'kill:rank=3:step=25'
wait $p0
rc0=$?
wait $p1
rc1=$?
[ $rc0 -eq 0 ] || fail "killed: node 0's launcher exited $rc0 (want 0: restarted alone)"
[ $rc1 -eq 1 ] || fail "killed: node 1's launcher exited $rc1 (want 1: dropped)"
grep -q "node 0 dropped this node from the job" "$out/killed-node1.log" ||
  fail "killed: node 1 does not say it was dropped"
check_alone killed
echo "PASS 2: rank 3 killed on node 1; node 1 dropped (exit 1), node 0 restarted alone, finished"

# 3. Only node 0 comes: after the last call (3 s) it starts alone, on 2 ranks with the global
# batch of 2 nodes kept from the first attempt (an elastic start, not a restart).
ip netns exec "$ns0" env DTRAIN_JOB_TOKEN="el-$tag" "$bin" launch "$config" --node-rank 0 \
  --nnodes 1:2 --nproc-per-node 2 --master-addr "$addr0" --master-port 29620 --last-call 3 \
  --out "$out/alone" --set distributed.bind="$addr0" --set distributed.strategy=fsdp \
  >"$out/alone-node0.log" 2>&1 || fail "alone: node 0's launcher exited $?"
grep -q "1 of at most 2 nodes checked in" "$out/alone-node0.log" || fail "alone: not started alone"
grep -q "elastic start: 2 rank(s) instead of 4; global batch 128 kept: data.batch_size 32 -> 64" \
  "$out/alone-node0.log" || fail "alone: the log does not say how the global batch was kept"
python3 -c 'import json,sys; s=json.load(open(sys.argv[1])); assert s["world_size"] == 2, s' \
  "$out/alone/summary.json" || fail "alone: summary world_size is not 2"
echo "PASS 3: node 0 alone after the last call: 2 ranks, data.batch_size 64, global batch 128"
