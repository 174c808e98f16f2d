// Checkpoint format version 2: the compression state (CompressionState) and Local SGD's per-rank
// optimizer state (ReplicaState) next to parameters and optimizer state; version-1 files still
// load.
#include <doctest/doctest.h>

#include <cmath>
#include <filesystem>

#include "checkpoint/checkpoint.h"
#include "checkpoint/safetensors.h"
#include "test_util.h"
#include "user_error.h"
#include "util/check.h"

using namespace dtrain;
using dtrain::testing::TempDir;

namespace {

Model small_model() {
  ModelConfig mc;
  mc.hidden = {4};
  return build_mlp(mc, 5, 3);
}

CheckpointMeta sgd_meta() {
  CheckpointMeta meta;
  meta.step = 3;
  meta.optimizer = "sgd";
  meta.rng = Rng(3).to_string();
  meta.strategy = "ddp";
  meta.world_size = 2;
  return meta;
}

CheckpointMeta local_sgd_meta() {
  CheckpointMeta m;
  m.step = 8;
  m.optimizer = "sgd";
  m.rng = Rng(3).to_string() + ";" + Rng(4).to_string() + ";" + Rng(5).to_string();
  m.strategy = "local_sgd";
  m.world_size = 3;
  return m;
}

// Three ranks' momentum: rank 0's as the optimizer state, ranks 1 and 2's as replicas.
struct Saved {
  std::vector<float> p, mom;
  ReplicaState rs;
};
Saved save3(const Model& m, const std::string& path) {
  const int64_t P = m.param_count();
  Saved s{std::vector<float>(P), std::vector<float>(P, 0.25f), {}};
  m.init(s.p.data(), 1);
  s.rs.world_size = 3;
  s.rs.names = {"momentum"};
  s.rs.ranks = {{std::vector<float>(P, 1.5f)}, {std::vector<float>(P, -2.0f)}};
  s.rs.ranks[1][0][2] = 7.0f;
  save_checkpoint(path, m, s.p.data(), {{"momentum", s.mom.data()}}, local_sgd_meta(), {}, s.rs);
  return s;
}

// The file at `path` rewritten with `edit` applied to its tensors and metadata.
template <typename Edit>
void rewrite(const std::string& path, Edit edit) {
  StFile f = read_safetensors(path);
  edit(f);
  std::vector<StTensorRef> refs;
  for (const auto& [name, t] : f.tensors) refs.push_back({name, t.shape, t.data.data()});
  write_safetensors(path, refs, f.metadata);
}

}  // namespace

TEST_CASE("checkpoint v2 stores every rank's residual and PowerSGD's Q, and reads them back") {
  TempDir dir;
  const Model m = small_model();
  const int64_t P = m.param_count();
  std::vector<float> p(P), mom(P, 0.5f), p2(P), mom2(P);
  m.init(p.data(), 1);
  CompressionState cs;
  cs.type = "powersgd";
  cs.world_size = 2;
  cs.residuals = {std::vector<float>(7, 1.5f), std::vector<float>(7, -2.0f)};
  cs.q = {1, 2, 3};
  cs.rng = Rng(9).to_string();
  const std::string path = dir / "c.safetensors";
  save_checkpoint(path, m, p.data(), {{"momentum", mom.data()}}, sgd_meta(), cs);
  // The layout as documented: per-rank tensors, sizes in the metadata.
  const StFile f = read_safetensors(path);
  CHECK(f.metadata.at("format_version") == "2");
  CHECK(f.metadata.at("compression") == "powersgd");
  CHECK(f.metadata.at("compression_world_size") == "2");
  CHECK(f.metadata.at("compression_residual_floats") == "7");
  CHECK(f.metadata.at("compression_q_floats") == "3");
  CHECK(f.tensors.at("comp.residual.rank1").data == cs.residuals[1]);
  CHECK(f.tensors.at("comp.q").shape == Shape{3});

  CompressionState got;
  load_checkpoint(path, m, p2.data(), {{"momentum", mom2.data()}}, &got);
  CHECK(p2 == p);
  CHECK(mom2 == mom);
  CHECK(got.type == "powersgd");
  CHECK(got.world_size == 2);
  CHECK(got.residuals == cs.residuals);
  CHECK(got.q == cs.q);
  CHECK(got.rng == cs.rng);
  CHECK(got.strategy == "ddp");
  // Weights only and without asking for the compression state: loads.
  std::vector<float> p3(P);
  load_checkpoint(path, m, p3.data(), {});
  CHECK(p3 == p);
  load_checkpoint(path, m, p3.data(), {{"momentum", mom2.data()}});

  // Error feedback off: no residual tensors, 0 floats recorded.
  CompressionState noef;
  noef.type = "int8";
  noef.world_size = 2;
  save_checkpoint(path, m, p.data(), {{"momentum", mom.data()}}, sgd_meta(), noef);
  CHECK(read_safetensors(path).tensors.count("comp.residual.rank0") == 0);
  load_checkpoint(path, m, p2.data(), {{"momentum", mom2.data()}}, &got);
  CHECK(got.type == "int8");
  CHECK(got.residuals.empty());
}

TEST_CASE(
    "checkpoint v1 files still load, and a missing compression tensor or version 4 is refused") {
  TempDir dir;
  const Model m = small_model();
  const int64_t P = m.param_count();
  std::vector<float> p(P), mom(P, 0.25f), p2(P), mom2(P);
  m.init(p.data(), 2);
  const std::string path = dir / "c.safetensors";
  CompressionState cs;
  cs.type = "int8";
  cs.world_size = 2;
  cs.residuals = {std::vector<float>(5, 1.0f), std::vector<float>(5, 2.0f)};
  save_checkpoint(path, m, p.data(), {{"momentum", mom.data()}}, sgd_meta(), cs);

  // As dtrain wrote version 1: no compression keys or tensors.
  const std::string v1 = dir / "v1.safetensors";
  std::filesystem::copy_file(path, v1);
  rewrite(v1, [](StFile& f) {
    f.metadata.insert_or_assign("format_version", std::string(1, '1'));
    for (auto it = f.tensors.begin(); it != f.tensors.end();)
      it = it->first.rfind("comp.", 0) == 0 ? f.tensors.erase(it) : std::next(it);
    for (const char* k : {"compression", "compression_world_size", "compression_residual_floats",
                          "compression_q_floats", "compression_rng"})
      f.metadata.erase(k);
  });
  CompressionState got;
  got.type = "x";
  load_checkpoint(v1, m, p2.data(), {{"momentum", mom2.data()}}, &got);
  CHECK(p2 == p);
  CHECK(mom2 == mom);
  CHECK(got.type == "none");
  CHECK(got.residuals.empty());

  // A version-1 file with compression tensors is not what version 1 wrote: refused.
  const std::string odd = dir / "odd.safetensors";
  std::filesystem::copy_file(path, odd);
  rewrite(odd,
          [](StFile& f) { f.metadata.insert_or_assign("format_version", std::string(1, '1')); });
  CHECK_THROWS_WITH_AS(load_checkpoint(odd, m, p2.data(), {{"momentum", mom2.data()}}),
                       doctest::Contains("unexpected tensor 'comp.residual.rank0'"), UserError);

  // Version 2 with a residual missing: refused by name, nothing changed.
  const std::string broken = dir / "broken.safetensors";
  std::filesystem::copy_file(path, broken);
  rewrite(broken, [](StFile& f) { f.tensors.erase("comp.residual.rank1"); });
  std::vector<float> untouched(P, 7.0f);
  CHECK_THROWS_WITH_AS(load_checkpoint(broken, m, untouched.data(), {{"momentum", mom2.data()}}),
                       doctest::Contains("needs tensor 'comp.residual.rank1' of shape [5]"),
                       UserError);
  CHECK(untouched == std::vector<float>(P, 7.0f));

  // A compression RNG state that is not one: refused when read, not at the first resume.
  const std::string bad_rng = dir / "bad_rng.safetensors";
  std::filesystem::copy_file(path, bad_rng);
  rewrite(bad_rng,
          [](StFile& f) { f.metadata.insert_or_assign("compression_rng", std::string("zz")); });
  CHECK_THROWS_WITH_AS(load_checkpoint(bad_rng, m, p2.data(), {}),
                       doctest::Contains("metadata 'compression_rng'"), UserError);

  // A future version: refused, naming the versions this dtrain reads.
  rewrite(path,
          [](StFile& f) { f.metadata.insert_or_assign("format_version", std::string(1, '4')); });
  CHECK_THROWS_WITH_AS(load_checkpoint(path, m, p2.data(), {}),
                       doctest::Contains("format version 4, this dtrain reads versions 1 to 3"),
                       UserError);
}

TEST_CASE("a checkpoint stores every rank's own optimizer state and reads it back") {
  TempDir dir;
  const Model m = small_model();
  const int64_t P = m.param_count();
  const std::string path = dir / "c.safetensors";
  const Saved s = save3(m, path);
  const StFile f = read_safetensors(path);
  CHECK(f.metadata.at("format_version") == "3");  // (only a file with per-rank state)
  CHECK(f.metadata.at("replica_world_size") == "3");
  CHECK(f.metadata.at("replica_states") == "momentum");
  CHECK(f.tensors.at("replica.rank2.momentum").shape == Shape{P});
  CHECK(f.tensors.count("replica.rank0.momentum") == 0);  // rank 0's is "optim.momentum.*"

  std::vector<float> p(P), mom(P);
  ReplicaState got;
  load_checkpoint(path, m, p.data(), {{"momentum", mom.data()}}, nullptr, &got);
  CHECK(mom == s.mom);
  CHECK(got.world_size == 3);
  CHECK(got.names == s.rs.names);
  CHECK(got.ranks == s.rs.ranks);
  // Weights only (eval, predict, generate) ignore it, and so does a resume that does not ask.
  std::vector<float> q(P);
  load_checkpoint(path, m, q.data(), {});
  CHECK(q == s.p);
  load_checkpoint(path, m, q.data(), {{"momentum", mom.data()}});
  // A file without it reads as none.
  save_checkpoint(dir / "plain.safetensors", m, s.p.data(), {{"momentum", mom.data()}},
                  local_sgd_meta());
  got.world_size = 5;
  load_checkpoint(dir / "plain.safetensors", m, p.data(), {{"momentum", mom.data()}}, nullptr,
                  &got);
  CHECK(got.world_size == 0);
  CHECK(got.ranks.empty());
}

TEST_CASE("a checkpoint whose per-rank optimizer record and tensors disagree is refused") {
  TempDir dir;
  const Model m = small_model();
  const int64_t P = m.param_count();
  const std::string path = dir / "c.safetensors";
  save3(m, path);
  std::vector<float> p(P), mom(P);
  ReplicaState got;
  const auto refused = [&](auto edit, const std::string& words) {
    const std::string bad = dir / "bad.safetensors";
    std::filesystem::copy_file(path, bad, std::filesystem::copy_options::overwrite_existing);
    rewrite(bad, edit);
    const std::string e = dtrain::testing::user_error([&] {
      load_checkpoint(bad, m, p.data(), {{"momentum", mom.data()}}, nullptr, &got);
    });
    CHECK_MESSAGE(e.find(words) != std::string::npos, e);
  };
  refused([](StFile& f) { f.tensors.erase("replica.rank2.momentum"); },
          "needs tensor 'replica.rank2.momentum' of shape [");
  refused([](StFile& f) { f.metadata["replica_world_size"] = "4"; },
          "needs tensor 'replica.rank3.momentum'");
  refused([](StFile& f) { f.metadata["replica_world_size"] = "1"; }, "is for 1 ranks");
  refused([](StFile& f) { f.metadata["replica_world_size"] = "x2"; }, "not an integer ('x2')");
  refused([](StFile& f) { f.metadata.erase("replica_states"); },
          "has metadata 'replica_world_size' without 'replica_states'");
  refused([](StFile& f) { f.metadata["replica_states"] = "momentum,a.b"; }, "names a state 'a.b'");
  // (a name twice: its data moved out at the first, the second read an empty buffer, a crash)
  refused([](StFile& f) { f.metadata["replica_states"] = "momentum,momentum"; },
          "names the state 'momentum' twice");
  refused([](StFile& f) { f.tensors.at("replica.rank1.momentum").data[3] = NAN; },
          "replica.rank1.momentum");
  // Its record in a version-2 file, or its tensors without its record, are unknown tensors.
  refused([](StFile& f) { f.metadata["format_version"] = "2"; },
          "unexpected tensor 'replica.rank1.momentum'");
  refused(
      [](StFile& f) {
        f.metadata.erase("replica_states");
        f.metadata.erase("replica_world_size");
      },
      "unexpected tensor 'replica.rank1.momentum'");
}
