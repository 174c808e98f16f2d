#!/usr/bin/env bash
# Two ranks on two "hosts": network namespaces joined by a veth pair, so the ranks reach each
# other over a real (virtual) link with their own addresses, not loopback. Needs root and
# iproute2; exits 77 (CTest: skipped) with the reason where namespaces cannot be made.
# Usage: netns_test.sh DTRAIN_BIN CONFIG
set -uo pipefail
bin=$1
config=$2
skip() {
  echo "SKIP: $*"
  exit 77
}
[ "$(id -u)" -eq 0 ] || skip "needs root to create network namespaces (ip netns add)"
command -v ip >/dev/null || skip "iproute2 (the ip command) is not installed"

tag=$$
ns0=dtrain-a-$tag
ns1=dtrain-b-$tag
veth0=dta$tag
veth1=dtb$tag
# Addresses inside our own namespaces only; nothing outside them is ever contacted.
sub=$((tag % 200 + 20))
addr0=10.213.$sub.1
addr1=10.213.$sub.2
out=$(mktemp -d)
cleanup() {
  ip netns del "$ns0" 2>/dev/null
  ip netns del "$ns1" 2>/dev/null
  rm -rf "$out"
}
trap cleanup EXIT
ip netns add "$ns0" 2>/dev/null || skip "ip netns add is not permitted here (no CAP_SYS_ADMIN or no netns support)"
ip netns add "$ns1" || skip "ip netns add failed for the second namespace"
ip link add "$veth0" type veth peer name "$veth1" || skip "cannot create a veth pair"
ip link set "$veth0" netns "$ns0" && ip link set "$veth1" netns "$ns1" || exit 1
ip -n "$ns0" addr add "$addr0/24" dev "$veth0" && ip -n "$ns1" addr add "$addr1/24" dev "$veth1" || exit 1
for ns in "$ns0" "$ns1"; do ip -n "$ns" link set lo up || exit 1; done
ip -n "$ns0" link set "$veth0" up && ip -n "$ns1" link set "$veth1" up || exit 1

port=29400  # a fresh namespace has no other listeners: any port is free
common=(WORLD_SIZE=2 LOCAL_WORLD_SIZE=1 LOCAL_RANK=0 MASTER_ADDR=$addr0 MASTER_PORT=$port
  DTRAIN_JOB_TOKEN=netns-$tag)
ip netns exec "$ns0" env "${common[@]}" RANK=0 "$bin" run "$config" --out "$out/run0" \
  --set distributed.bind="$addr0" --set distributed.rendezvous_timeout_s=30 >"$out/r0.log" 2>&1 &
p0=$!
ip netns exec "$ns1" env "${common[@]}" RANK=1 "$bin" run "$config" --out "$out/run1" \
  --set distributed.bind="$addr1" --set distributed.rendezvous_timeout_s=30 >"$out/r1.log" 2>&1 &
p1=$!
wait $p0
rc0=$?
wait $p1
rc1=$?
if [ $rc0 -ne 0 ] || [ $rc1 -ne 0 ]; then
  echo "FAIL: rank 0 exit $rc0, rank 1 exit $rc1"
  echo "--- rank 0"; cat "$out/r0.log"; echo "--- rank 1"; cat "$out/r1.log"
  exit 1
fi
grep -q '"world_size": 2' "$out/run0/summary.json" || { echo "FAIL: no 2-rank summary"; exit 1; }
echo "PASS: 2 ranks in namespaces $ns0 ($addr0) and $ns1 ($addr1) trained together"
grep -E '"test_accuracy"|"comm_bytes_sent"' "$out/run0/summary.json"
