// The rendezvous on arbitrary store calls: rank 0's store (a MemoryStore) and the coordinator
// watching its sets (JoinCoordinator, wired as RendezvousHost wires it, without its timer and
// service threads) receive a sequence of Store requests as StoreService would apply them, then
// every rank's side decodes the result (decode_join_result). The join values
// are JoinRequests as the fuzzer mutates them (decode_join_request, join_refusal); the result
// decoder also sees every set value as if rank 0 had sent it.
//
// Input: [u8 world size - 1 (mod 4)] then records of [u8 method][u16 little-endian length]
// [length bytes: a serialized wire::StoreRequest]; method % 4 = Set, Add, Get, Wait. A request
// that does not parse is skipped (gRPC would have refused it). fuzz/gen_corpus.cc writes the
// seeds (complete, refused and timed-out rendezvous).
//
// Checked besides "no crash, no sanitizer report": every store call answers with its value or
// a CommError (a result's decoder: a UserError for a refusal), an asynchronous wait answers exactly
// once, and a result "ok" lists every rank once in rank order with the address it joined from,
// which each rank's decoder accepts.
#include <algorithm>
#include <chrono>
#include <map>
#include <string>
#include <vector>

#include <google/protobuf/stubs/logging.h>

#include "comm/rendezvous/rendezvous.h"
#include "fuzz_util.h"
#include "util/check.h"

namespace {
using namespace dtrain;
using namespace dtrain::grpc_detail;
using Clock = std::chrono::steady_clock;

void require(bool ok, const char* what) {
  if (!ok) {
    std::fprintf(stderr, "fuzz_rendezvous: broken property: %s\n", what);
    std::abort();
  }
}

// A Get or Wait as StoreService serves it: asynchronously, failing at its deadline (now).
void wait_async(MemoryStore& store, std::vector<std::string> keys) {
  int answers = 0;
  store.when_set(std::move(keys), Clock::now(),
                 [&](const std::string&, const std::vector<std::string>&) { ++answers; });
  store.expire();
  require(answers == 1, "an asynchronous wait answers exactly once");
}

void apply(MemoryStore& store, int method, const wire::StoreRequest& req) {
  try {
    switch (method) {
      case 0:
        store.set(req.key(), req.value());
        break;
      case 1:
        (void)store.add(req.key(), req.delta());
        break;
      case 2:
        (void)store.get(req.key(), Clock::now());
        wait_async(store, {req.key()});
        break;
      default:
        store.wait({req.keys().begin(), req.keys().end()}, Clock::now());
        wait_async(store, {req.keys().begin(), req.keys().end()});
        break;
    }
  } catch (const CommError&) {  // timed out, or a key that holds no counter: an answer
  }
}

// An "ok" result must list every rank once, in rank order, with an address it joined from.
void check_result(const std::string& result, int world,
                  const std::map<int, std::vector<std::string>>& joined_from) {
  if (result.rfind("ok", 0) != 0) return;
  wire::JoinReply reply;
  require(reply.ParseFromString(result.substr(2)), "an ok result holds a JoinReply");
  require(reply.peers_size() == world, "an ok result lists every rank");
  for (int r = 0; r < world; ++r) {
    const std::string& addr = reply.peers(r).address();
    const auto it = joined_from.find(r);
    require(it != joined_from.end() &&
                std::find(it->second.begin(), it->second.end(), addr) != it->second.end(),
            "the table holds the address each rank joined from");
    try {
      (void)decode_join_result(result, r, world, addr);
    } catch (const CommError&) {
      require(false, "every rank accepts an ok result with its own address");
    }
  }
}

}  // namespace

// protobuf logs every string field that is not UTF-8 (a parse that fails, as it should): quiet.
extern "C" int LLVMFuzzerInitialize(int*, char***) {
  google::protobuf::SetLogHandler(
      [](google::protobuf::LogLevel, const char*, int, const std::string&) {});
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  std::string_view in = fuzz::as_view(data, size);
  if (in.empty()) return 0;
  const int world = 1 + static_cast<uint8_t>(in[0]) % 4;
  in.remove_prefix(1);
  JoinCoordinator coord(world, "cafe");
  MemoryStore store([&](const std::string& key, const std::string& value) {
    if (const std::string r = coord.on_set(key, value); !r.empty())
      store.set(kRendezvousResultKey, r);
  });
  std::map<int, std::vector<std::string>> joined_from;  // rank -> addresses of its join values
  bool forged_result = false;  // the input wrote rdzv/result itself (any token holder can)
  while (in.size() >= 3) {
    const int method = static_cast<uint8_t>(in[0]) % 4;
    const size_t len =
        std::min<size_t>(static_cast<uint8_t>(in[1]) | size_t{uint8_t(in[2])} << 8, in.size() - 3);
    wire::StoreRequest req;
    const bool parsed = req.ParseFromArray(in.data() + 3, static_cast<int>(len));
    in.remove_prefix(3 + len);
    if (!parsed) continue;
    forged_result |= method < 2 && req.key() == "rdzv/result";
    if (method == 0) {
      try {  // what each rank's decoder makes of these bytes as a result
        (void)decode_join_result(req.value(), 0, world, "a:1");
      } catch (const CommError&) {
      } catch (const UserError&) {  // a refusal ("failrefused: ...")
      }
      if (req.key().rfind("rdzv/join/", 0) == 0) {
        try {
          const wire::JoinRequest j = decode_join_request(req.value());
          joined_from[j.rank()].push_back(j.listen_address());
        } catch (const WireError&) {
        }
      }
    }
    apply(store, method, req);
  }
  std::string result;
  try {
    result = store.get(kRendezvousResultKey, Clock::now());
  } catch (const CommError&) {
  }
  if (!forged_result) check_result(result, world, joined_from);
  return 0;
}
