// What the comm fuzz targets (fuzz/frame.cc, fuzz/rendezvous.cc) exercise and found, with the
// found inputs committed in fuzz/regressions/<target>/:
// - rendezvous/counter_overflow: two Store Add calls (any token holder can send them) that sum
//   past int64: signed overflow in MemoryStore::add, undefined behaviour (UBSan: "signed integer
//   overflow"); now refused with a CommError, the counter unchanged. (Seen while writing the
//   target, which did not reach it in 60 s; the bytes are the target's input format.)
// Plus the pure rendezvous pieces the target drives (JoinCoordinator, decode_join_result).
#include <doctest/doctest.h>

#include <cstdint>
#include <fstream>
#include <limits>
#include <sstream>
#include <string>

#include "comm/grpc_internal.h"
#include "comm/rendezvous/rendezvous.h"
#include "comm/rendezvous/store.h"
#include "dtrain.pb.h"
#include "util/check.h"

using namespace dtrain;
using namespace dtrain::grpc_detail;

namespace {

std::string read_input(const std::string& rel) {
  std::ifstream in(std::string(DTRAIN_SOURCE_DIR) + "/" + rel, std::ios::binary);
  REQUIRE(in);
  std::ostringstream s;
  s << in.rdbuf();
  return s.str();
}

// Replays the Add calls of a fuzz/rendezvous.cc input ([u8 world - 1] then records of
// [u8 method][u16 length][StoreRequest]) on `store`; returns what the last one threw, or "".
std::string replay_adds(const std::string& input, MemoryStore& store) {
  std::string error;
  for (size_t at = 1; at + 3 <= input.size();) {
    const int method = static_cast<uint8_t>(input[at]) % 4;
    const size_t len = static_cast<uint8_t>(input[at + 1]) | size_t{uint8_t(input[at + 2])} << 8;
    wire::StoreRequest req;
    REQUIRE(req.ParseFromArray(input.data() + at + 3, static_cast<int>(len)));
    at += 3 + len;
    REQUIRE(method == 1);
    try {
      store.add(req.key(), req.delta());
      error.clear();
    } catch (const CommError& e) {
      error = e.what();
    }
  }
  return error;
}

std::string join_value(int rank, int world, const std::string& hash = "cafe") {
  wire::JoinRequest j;
  j.set_protocol_version(kGrpcProtocolVersion);
  j.set_rank(rank);
  j.set_world_size(world);
  j.set_listen_address("h:" + std::to_string(100 + rank));
  j.set_config_hash(hash);
  return j.SerializeAsString();
}

std::string error_of_result(const std::string& result, int rank, int world,
                            const std::string& addr) {
  try {
    (void)decode_join_result(result, rank, world, addr);
  } catch (const CommError& e) {
    return e.what();
  } catch (const UserError& e) {
    return std::string("user error: ") + e.what();
  }
  return "";
}

}  // namespace

TEST_CASE("fuzz regression: store counters that would overflow int64 are refused") {
  MemoryStore store;
  CHECK(replay_adds(read_input("fuzz/regressions/rendezvous/counter_overflow"), store) ==
        "store: adding 1 to counter 'n' overflows");
  CHECK(store.add("n", 0) == std::numeric_limits<int64_t>::max());  // unchanged
  CHECK(store.add("m", std::numeric_limits<int64_t>::min()) == std::numeric_limits<int64_t>::min());
  CHECK_THROWS_WITH_AS(store.add("m", -1), "store: adding -1 to counter 'm' overflows", CommError);
  CHECK(store.add("m", std::numeric_limits<int64_t>::max()) == -1);
}

TEST_CASE("store: a counter is a whole integer, not a prefix of one") {
  MemoryStore store;
  store.set("a", "12abc");
  CHECK_THROWS_WITH_AS(store.add("a", 1), "store: key 'a' does not hold a counter", CommError);
  store.set("b", "99999999999999999999");  // out of int64's range
  CHECK_THROWS_WITH_AS(store.add("b", 1), "store: key 'b' does not hold a counter", CommError);
  store.set("c", "");
  CHECK_THROWS_AS(store.add("c", 1), CommError);
  store.set("d", "-7");
  CHECK(store.add("d", 2) == -5);
}

TEST_CASE("rendezvous coordinator: decides once, with every rank's address in rank order") {
  JoinCoordinator c(3, "cafe");
  CHECK(c.on_set("rdzv/joins", "1") == "");  // not a join key
  CHECK(c.on_set("rdzv/join/1", join_value(2, 3)) == "");
  CHECK(c.on_set("rdzv/join/2", join_value(0, 3)) == "");
  CHECK(c.missing() == std::vector<int>{1});
  const std::string result = c.on_set("rdzv/join/3", join_value(1, 3));
  REQUIRE(result.rfind("ok", 0) == 0);
  CHECK(c.decided());
  CHECK_FALSE(c.decide());
  CHECK(c.on_set("rdzv/join/4", join_value(1, 3)) == "");  // late: ignored
  for (int r = 0; r < 3; ++r) {
    const auto peers = decode_join_result(result, r, 3, "h:" + std::to_string(100 + r));
    REQUIRE(peers.size() == 3);
    CHECK(peers[2].address == "h:102");
  }
  // A rank whose listen address is not the table's joined after the rendezvous completed.
  CHECK(error_of_result(result, 1, 3, "h:999")
            .starts_with("rank 1 joined after the rendezvous completed: the job's rank 1 is "
                         "another process (a "
                         "second process given RANK=1, or this rank restarted alone"));
  CHECK(error_of_result(result, 1, 4, "h:101") == "rendezvous returned 3 peers for world size 4");
}

TEST_CASE("rendezvous coordinator: the first refusal decides, for every rank alike") {
  JoinCoordinator twice(2, "cafe");
  CHECK(twice.on_set("rdzv/join/1", join_value(0, 2)) == "");
  // The same key again: a Set retried after its reply was lost, not a second join.
  CHECK(twice.on_set("rdzv/join/1", join_value(0, 2)) == "");
  CHECK_FALSE(twice.decided());
  // Another key from the same place: the same process joining again (it saw rank 0's store
  // change: join_rendezvous), not a second process -- two cannot listen on one address.
  CHECK(twice.on_set("rdzv/join/2", join_value(0, 2)) == "");
  CHECK_FALSE(twice.decided());
  wire::JoinRequest other;
  REQUIRE(other.ParseFromString(join_value(0, 2)));
  other.set_listen_address("h:999");
  // The same from elsewhere marked as a join again: a stale copy of a rank that has joined
  // (stopped, then continued), ignored; it finds another address in the result.
  other.set_rejoin(true);
  CHECK(twice.on_set("rdzv/join/3", other.SerializeAsString()) == "");
  other.set_rejoin(false);
  CHECK(twice.on_set("rdzv/join/4", other.SerializeAsString()) ==
        "failrefused: rank 0 joined twice (from h:100 and h:999)");
  // A copy's join again that came first is replaced by the rank's first join from elsewhere:
  // the live process wins, and the copy finds another address in the result.
  JoinCoordinator copy_first(2, "cafe");
  wire::JoinRequest stale;
  REQUIRE(stale.ParseFromString(join_value(1, 2)));
  stale.set_listen_address("h:555");
  stale.set_rejoin(true);
  CHECK(copy_first.on_set("rdzv/join/1-a", stale.SerializeAsString()) == "");
  CHECK(copy_first.on_set("rdzv/join/1-b", join_value(1, 2)) == "");
  const std::string done = copy_first.on_set("rdzv/join/2-c", join_value(0, 2));
  REQUIRE(done.rfind("ok", 0) == 0);
  CHECK(decode_join_result(done, 1, 2, "h:101")[1].address == "h:101");
  CHECK(error_of_result(done, 1, 2, "h:555").starts_with("rank 1 joined after the rendezvous"));
  JoinCoordinator hash(2, "cafe");
  const std::string r = hash.on_set("rdzv/join/1", join_value(1, 2, "beef"));
  CHECK(r == "failrefused: rank 1 has config hash beef, rank 0 has cafe");
  // A refusal is the user's to fix (exit 2, no restart); a malformed join is not.
  CHECK(error_of_result(r, 0, 2, "h:100") ==
        "user error: rank 1 has config hash beef, rank 0 has cafe");
  JoinCoordinator garbage(2, "cafe");
  CHECK(garbage.on_set("rdzv/join/1", "\xff\xff") == "faila malformed join: not a JoinRequest");
  CHECK(garbage.decided());
  JoinCoordinator timeout(2, "cafe");
  CHECK(timeout.decide());
  CHECK(timeout.on_set("rdzv/join/1", join_value(0, 2)) == "");  // decided: ignored
}

TEST_CASE("rendezvous result: whatever rank 0 (or an impostor) sends is an answer or CommError") {
  CHECK(error_of_result("", 0, 2, "a") == "rendezvous returned a malformed result");
  CHECK(error_of_result("ok\xff\xff\xff", 0, 2, "a") == "rendezvous returned a malformed result");
  wire::JoinReply reply;
  wire::Peer* p = reply.add_peers();
  p->set_rank(1);
  p->set_address("x:1");
  reply.add_peers()->set_rank(0);
  CHECK(error_of_result("ok" + reply.SerializeAsString(), 0, 2, "x:1") ==
        "rendezvous returned a bad peer table (entry 0)");
}
