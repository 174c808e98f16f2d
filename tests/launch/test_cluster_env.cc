// Kubernetes (Kubeflow Trainer, Indexed Job) variables for `dtrain run` and `dtrain launch`,
// the multi-node flags' resolution, elastic rank ranges and the global-batch rule.
#include <doctest/doctest.h>

#include <functional>
#include <map>
#include <optional>
#include <string>

#include "launch/dist_env.h"
#include "launch/elastic.h"
#include "launch/node_env.h"
#include "test_util.h"
#include "util/check.h"

using namespace dtrain;
using dtrain::testing::contains;
using Env = std::map<std::string, std::string>;

namespace {

std::string user_error(const std::function<void()>& f) {
  try {
    f();
  } catch (const UserError& e) {
    return e.what();
  }
  return "<no error>";
}

// env with key set to value (std::string values: GCC 12 warns falsely on assigning literals).
Env with(Env env, const std::string& key, const std::string& value) {
  env.insert_or_assign(key, value);
  return env;
}

}  // namespace

TEST_CASE("resolve_dist_env: Kubeflow Trainer's PET_ variables, one rank per pod") {
  const Env env = {{"PET_NNODES", "4"},
                   {"PET_NODE_RANK", "3"},
                   {"PET_NPROC_PER_NODE", "1"},
                   {"PET_MASTER_ADDR", "job-node-0-0.job"},
                   {"PET_MASTER_PORT", "29400"}};
  DistEnv d = resolve_dist_env(env, 1);
  CHECK(d.source == "kubeflow");
  CHECK(d.rank == 3);
  CHECK(d.world_size == 4);
  CHECK(d.local_rank == 0);
  CHECK(d.local_world_size == 1);
  CHECK(d.master_addr == "job-node-0-0.job");
  CHECK(d.master_port == 29400);

  // MASTER_* win over PET_MASTER_*; torchrun's variables (what `dtrain launch` sets for its
  // ranks inside the pod) win over the PET_ ones.
  Env e2 = env;
  e2.emplace("MASTER_ADDR", "10.1.1.1");
  e2.emplace("MASTER_PORT", "1000");
  d = resolve_dist_env(e2, 1);
  CHECK(d.master_addr == "10.1.1.1");
  CHECK(d.master_port == 1000);
  e2.emplace("RANK", "5");
  e2.emplace("WORLD_SIZE", "8");
  d = resolve_dist_env(e2, 1);
  CHECK(d.source == "torchrun");
  CHECK(d.rank == 5);
  // Flags win over everything.
  DistOverrides f;
  f.rank = 1;
  CHECK(resolve_dist_env(env, 1, f).rank == 1);

  // PET_NPROC_PER_NODE absent: one rank per pod.
  CHECK(resolve_dist_env({{"PET_NNODES", "2"}, {"PET_NODE_RANK", "1"}, {"PET_MASTER_PORT", "5"}}, 1)
            .world_size == 2);

  // "auto" and "cpu" (PyTorchJob's default) are one rank per pod, as dtrain launch reads them;
  // they were "not an integer".
  for (const char* v : {"auto", "cpu"}) {
    const DistEnv d1 = resolve_dist_env(with(env, "PET_NPROC_PER_NODE", v), 1);
    CHECK(d1.local_world_size == 1);
    CHECK(d1.world_size == resolve_dist_env(env, 1).world_size);
  }
  CHECK(contains(user_error([&] { resolve_dist_env(with(env, "PET_NPROC_PER_NODE", "gpu"), 1); }),
                 "PET_NPROC_PER_NODE=gpu: dtrain trains on CPUs"));
  // Several ranks per pod need dtrain launch; a partial set, a bad number, an out-of-range rank
  // and a missing port are refused, each naming its variable.
  const Env many = with(env, "PET_NPROC_PER_NODE", "4");
  CHECK(contains(user_error([&] { resolve_dist_env(many, 1); }), "PET_NPROC_PER_NODE=4"));
  CHECK(contains(user_error([&] { resolve_dist_env(many, 1); }), "dtrain launch"));
  CHECK(contains(user_error([&] {
                   resolve_dist_env({{"PET_NODE_RANK", "0"}}, 1);
                 }),
                 "PET_NODE_RANK is set but PET_NNODES is not"));
  Env bad = with(env, "PET_NODE_RANK", "x1");
  CHECK(contains(user_error([&] { resolve_dist_env(bad, 1); }), "PET_NODE_RANK='x1'"));
  bad = with(env, "PET_NODE_RANK", "4");
  CHECK(contains(user_error([&] { resolve_dist_env(bad, 1); }), "PET_NODE_RANK=4 is out of range"));
  bad = env;
  bad.erase("PET_MASTER_PORT");
  CHECK(contains(user_error([&] { resolve_dist_env(bad, 1); }), "MASTER_PORT is not set"));
}

TEST_CASE("resolve_dist_env: an Indexed Job's JOB_COMPLETION_INDEX is the rank") {
  const Env env = {
      {"JOB_COMPLETION_INDEX", "2"}, {"MASTER_ADDR", "dtrain-0.dtrain"}, {"MASTER_PORT", "29500"}};
  DistEnv d = resolve_dist_env(env, 3);
  CHECK(d.source == "k8s-indexed");
  CHECK(d.rank == 2);
  CHECK(d.world_size == 3);  // the config's
  CHECK(d.local_world_size == 1);
  CHECK(d.master_addr == "dtrain-0.dtrain");
  DistOverrides f;
  f.world_size = 6;
  CHECK(resolve_dist_env(env, 3, f).world_size == 6);
  // Other sources win (a launcher inside the pod).
  Env e2 = env;
  e2.emplace("RANK", "0");
  e2.emplace("WORLD_SIZE", "1");
  CHECK(resolve_dist_env(e2, 3).source == "torchrun");
  // An index beyond the config's world, and a malformed one, name the variable.
  CHECK(contains(user_error([&] { resolve_dist_env(env, 2); }),
                 "JOB_COMPLETION_INDEX=2 is out of range for distributed.world_size=2"));
  CHECK(contains(user_error([&] {
                   resolve_dist_env({{"JOB_COMPLETION_INDEX", "-"}, {"MASTER_PORT", "1"}}, 2);
                 }),
                 "JOB_COMPLETION_INDEX='-' is not an integer"));
  // Without MASTER_ADDR every pod would dial its own loopback until the rendezvous timed out.
  CHECK(contains(user_error([&] {
                   resolve_dist_env({{"JOB_COMPLETION_INDEX", "1"}, {"MASTER_PORT", "29500"}}, 2);
                 }),
                 "MASTER_ADDR is not set: each pod of an Indexed Job is a host of its own"));
  // Also when the world comes from --world-size (a flag made the source "flags" before the check).
  DistOverrides w;
  w.world_size = 2;
  CHECK(
      contains(user_error([&] {
                 resolve_dist_env({{"JOB_COMPLETION_INDEX", "1"}, {"MASTER_PORT", "29500"}}, 1, w);
               }),
               "MASTER_ADDR is not set"));
}

TEST_CASE("resolve_node_env: flags, then Kubeflow, then the Indexed Job's index") {
  NodeEnv n = resolve_node_env({}, {}, 3);
  CHECK(n.nnodes == 1);
  CHECK(n.node_rank == 0);
  CHECK(n.nproc_per_node == 3);
  CHECK(n.master_addr == "127.0.0.1");
  CHECK(n.master_port == 0);

  // One node ignores a MASTER_* left in the environment; only --master-port pins the port.
  n = resolve_node_env({{"MASTER_ADDR", "h"}, {"MASTER_PORT", "7"}}, {}, 2);
  CHECK(n.master_addr == "127.0.0.1");
  CHECK(n.master_port == 0);
  NodeOverrides port_only;
  port_only.master_port = 29000;
  CHECK(resolve_node_env({}, port_only, 2).master_port == 29000);
  // Not even read: Kubernetes' service-link form of MASTER_PORT, an empty PET_MASTER_ADDR, an
  // Indexed Job's index for a sweep of one-node jobs (these refused the launch, exit 2).
  n = resolve_node_env({{"MASTER_PORT", "tcp://10.96.0.12:29500"},
                        {"MASTER_ADDR", "node0:29500"},
                        {"PET_MASTER_ADDR", ""},
                        {"PET_MASTER_PORT", "0"},
                        {"JOB_COMPLETION_INDEX", "3"}},
                       {}, 2);
  CHECK(n.master_addr == "127.0.0.1");
  CHECK(n.master_port == 0);
  CHECK(n.node_rank == 0);

  const Env pet = {{"PET_NNODES", "3"},          {"PET_NODE_RANK", "2"},
                   {"PET_NPROC_PER_NODE", "4"},  {"PET_MASTER_ADDR", "trainer-node-0-0.trainer"},
                   {"PET_MASTER_PORT", "29400"}, {"MASTER_ADDR", "other"},
                   {"JOB_COMPLETION_INDEX", "1"}};
  n = resolve_node_env(pet, {}, 2);
  CHECK(n.nnodes == 3);
  CHECK(n.node_rank == 2);  // PET_NODE_RANK over JOB_COMPLETION_INDEX
  CHECK(n.nproc_per_node == 4);
  CHECK(n.master_addr == "trainer-node-0-0.trainer");
  CHECK(n.master_port == 29400);
  CHECK(n.nnodes_from == "PET_NNODES");

  // An Indexed Job: the index is the node rank, the rest from flags.
  NodeOverrides f;
  f.nnodes = 2;
  f.master_addr = "dtrain-0.dtrain";
  f.master_port = 29500;
  n = resolve_node_env({{"JOB_COMPLETION_INDEX", "1"}}, f, 2);
  CHECK(n.node_rank == 1);
  CHECK(n.node_rank_from == "JOB_COMPLETION_INDEX");
  // Flags win.
  f.node_rank = 0;
  f.nproc_per_node = 5;
  n = resolve_node_env(pet, f, 2);
  CHECK(n.nnodes == 2);
  CHECK(n.node_rank == 0);
  CHECK(n.nproc_per_node == 5);
  CHECK(n.master_addr == "dtrain-0.dtrain");
  CHECK(n.master_port == 29500);
}

TEST_CASE("resolve_node_env: refusals name the flag or variable") {
  auto err = [](const Env& env, const NodeOverrides& f) {
    return user_error([&] { resolve_node_env(env, f, 2); });
  };
  NodeOverrides f;
  f.nnodes = 2;
  f.node_rank = 2;
  f.master_addr = "h0";
  f.master_port = 100;
  CHECK(contains(err({}, f), "--node-rank=2 is out of range: node ranks are 0..1 for --nnodes=2"));
  // Without --nnodes: the default is named as such, not as "default=1".
  NodeOverrides one;
  one.node_rank = 5;
  const std::string msg = err({}, one);
  CHECK_MESSAGE(contains(msg,
                         "--node-rank=5 is out of range: node ranks are 0..0 for one node "
                         "(the default; give --nnodes)"),
                msg);
  f.node_rank = 1;
  CHECK(err({}, f) == "<no error>");
  NodeOverrides g = f;
  g.master_addr.reset();
  CHECK(contains(err({}, g), "give --master-addr"));
  g.master_addr = "127.0.0.1";
  CHECK(contains(err({}, g), "loopback"));
  // Every spelling of loopback and the wildcard (which a dialling node takes for itself): each
  // waited out the 300 s join timeout.
  for (const char* a : {"::1", "[::1]", "0:0:0:0:0:0:0:1", "::ffff:127.0.0.1", "127.1.2.3", "127.1",
                        "2130706433", "LOCALHOST", "localhost.", "node.localhost", "127.0.0.1."}) {
    g.master_addr = a;
    CHECK_MESSAGE(contains(err({}, g), "is a loopback address"), a);
  }
  for (const char* a : {"0.0.0.0", "::", "[::]", "0", "0.0.0.0."}) {
    g.master_addr = a;
    CHECK_MESSAGE(contains(err({}, g), "is the wildcard address"), a);
  }
  for (const char* a : {"10.0.0.7", "fe80::1", "node0.cluster", "[2001:db8::5]"}) {
    g.master_addr = a;
    CHECK_MESSAGE(err({}, g) == "<no error>", a);
  }
  g.master_addr = "[::1";  // (became "[[::1]:P", waited out the rendezvous timeout)
  CHECK(contains(err({}, g), "unbalanced"));
  g = f;
  g.master_port.reset();
  CHECK(contains(err({}, g), "give --master-port"));
  g.master_port = 65535;
  CHECK(contains(err({}, g), "the next port too"));
  g.master_port = 70000;
  CHECK(contains(err({}, g), "--master-port=70000 is not a TCP port"));
  g = f;
  g.nnodes = 0;
  CHECK(contains(err({}, g), "--nnodes=0"));
  g = f;
  g.nproc_per_node = 0;
  CHECK(contains(err({}, g), "--nproc-per-node=0"));
  CHECK(contains(err({{"PET_NNODES", "two"}}, {}), "PET_NNODES='two' is not an integer"));
  CHECK(contains(err({{"PET_NNODES", "2"},
                      {"PET_NODE_RANK", "0"},
                      {"PET_MASTER_ADDR", ""},
                      {"PET_MASTER_PORT", "9"}},
                     {}),
                 "PET_MASTER_ADDR is empty"));
  CHECK(contains(err({{"PET_NNODES", "2"},
                      {"PET_NODE_RANK", "0"},
                      {"PET_MASTER_ADDR", "192.0.2.2:29671"},
                      {"PET_MASTER_PORT", "29671"}},
                     {}),
                 "PET_MASTER_ADDR '192.0.2.2:29671' holds a port"));
}

TEST_CASE("parse_rank_range: N or MIN:MAX") {
  CHECK(parse_rank_range("4", "--nproc").min == 4);
  CHECK(parse_rank_range("4", "--nproc").max == 4);
  const RankRange r = parse_rank_range("3:4", "--nproc");
  CHECK(r.min == 3);
  CHECK(r.max == 4);
  for (const char* bad : {"", "0", "4:3", "1:2000", ":4", "3:", "a:b", "3:4:5", " 3"})
    CHECK_MESSAGE(contains(user_error([&] { parse_rank_range(bad, "--nproc"); }), "--nproc '"),
                  bad);
}

TEST_CASE("keep_global_batch: per-rank batch first, then accumulation, else a clear refusal") {
  // 4 x 24 = 96 on 3 ranks: 32 each.
  BatchPlan p = keep_global_batch(24, 1, 4, 3);
  CHECK(p.batch_size == 32);
  CHECK(p.grad_accum == 1);
  CHECK(describe_batch_change({24, 1}, p) == "data.batch_size 24 -> 32");
  // 4 x 6 x 2 = 48 on 3 ranks, accumulation kept: 8 each.
  p = keep_global_batch(6, 2, 4, 3);
  CHECK(p.batch_size == 8);
  CHECK(p.grad_accum == 2);
  // 2 x 3 x 2 = 12 on 4 ranks: 12 / (4 x 2) is not whole, accumulation 3 gives 1 each.
  p = keep_global_batch(3, 2, 2, 4);
  CHECK(p.batch_size == 1);
  CHECK(p.grad_accum == 3);
  CHECK(describe_batch_change({3, 2}, p) ==
        "data.batch_size 3 -> 1, train.grad_accum_steps 2 -> 3");
  CHECK(describe_batch_change({3, 2}, {3, 2}).empty());
  // The same world: nothing changes. Growing works too.
  p = keep_global_batch(32, 1, 4, 4);
  CHECK(p.batch_size == 32);
  CHECK(keep_global_batch(32, 1, 2, 4).batch_size == 16);
  // 4 x 32 = 128 is no multiple of 3.
  const std::string e = user_error([] { keep_global_batch(32, 1, 4, 3); });
  CHECK(contains(e, "cannot keep the global batch 128"));
  CHECK(contains(e, "on 3 data-parallel ranks"));
}

TEST_CASE("resize_settings: the batch plan, and under scale_lr linear the first ranks' rate") {
  using V = std::vector<std::string>;
  CHECK(resize_settings({32, 1}, 0.05, false, 4, 3) ==
        V{"data.batch_size=32", "train.grad_accum_steps=1"});
  // lr x 4 replicas, as the uninterrupted run's plan_steps computes it, the same double.
  const V linear = resize_settings({32, 1}, 0.05, true, 4, 3);
  REQUIRE(linear.size() == 4);
  CHECK(linear[2] == "optimizer.scale_lr=none");
  CHECK(linear[3] == "optimizer.lr=0.2");
  CHECK(std::stod(linear[3].substr(13)) == 0.05 * 4);
  // A rate that is no short decimal round-trips bitwise.
  const V odd = resize_settings({8, 1}, 0.1 / 3, true, 3, 2);
  CHECK(std::stod(odd[3].substr(13)) == (0.1 / 3) * 3);
  // The same replicas: nothing to pin.
  CHECK(resize_settings({32, 1}, 0.05, true, 4, 4).size() == 2);
}

TEST_CASE("keep_global_batch: the rule by brute force on small batches, and no endless search") {
  // The rule as written (rule 2 by trying every accumulation in turn) against the function.
  for (int64_t bs = 1; bs <= 12; ++bs)
    for (int64_t acc = 1; acc <= 7; ++acc)
      for (int w = 1; w <= 5; ++w)
        for (int nw = 1; nw <= 6; ++nw) {
          CAPTURE(bs);
          CAPTURE(acc);
          CAPTURE(w);
          CAPTURE(nw);
          const int64_t g = bs * w * acc;
          std::optional<BatchPlan> want;
          for (int64_t a = acc; a * nw <= g && !want; ++a)
            if (g % (nw * a) == 0) want = BatchPlan{g / (nw * a), a};
          if (want) {
            const BatchPlan got = keep_global_batch(bs, acc, w, nw);
            CHECK(got.batch_size == want->batch_size);
            CHECK(got.grad_accum == want->grad_accum);
          } else {
            CHECK(contains(user_error([&] { keep_global_batch(bs, acc, w, nw); }),
                           "cannot keep the global batch"));
          }
        }
  // A huge accumulation (was: a search of ~2^40 steps, a launcher spinning past SIGTERM), and
  // products past int64 (were undefined), answer at once.
  CHECK(contains(user_error([] { keep_global_batch(1, (int64_t{1} << 40) + 1, 3, 2); }),
                 "is not a multiple of 2"));
  // 4 x 3 x 2^40 on 8 ranks: 3 x 2^39 each, whose smallest divisor above 2^40 is itself.
  const BatchPlan p = keep_global_batch(3, int64_t{1} << 40, 4, 8);
  CHECK(p.batch_size == 1);
  CHECK(p.grad_accum == 3 * (int64_t{1} << 39));
  CHECK(contains(user_error([] { keep_global_batch(1, int64_t{1} << 62, 4, 3); }),
                 "above 2^50 samples"));
}
