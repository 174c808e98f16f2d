// train.init_from: a fresh run starts from a file's weights -- a dtrain checkpoint (file, sharded
// folder, run folder) or a PyTorch state_dict saved with safetensors (a bare nn.Sequential's names,
// nanoGPT's tied GPT with one of the two names and its mask buffers) -- on any layout, and a file
// that does not fit the model is refused before the run's folder is touched.
#include <doctest/doctest.h>

#include <bit>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <functional>
#include <limits>
#include <map>
#include <string>
#include <vector>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "checkpoint/safetensors.h"
#include "test_util.h"

using dtrain::testing::CmdResult;
using dtrain::testing::contains;
using dtrain::testing::read_text;
using dtrain::testing::run_cmd;
using dtrain::testing::TempDir;

namespace {

const std::string kBin = DTRAIN_BIN;

const char* kMlp = R"(seed: 3
model: {hidden: [16, 8]}
data:
  format: synthetic
  synthetic: {samples: 600, features: 5, classes: 3, noise: 0.3}
  batch_size: 20
optimizer: {type: sgd, lr: 0.1, momentum: 0.9}
train: {max_steps: 8}
runtime: {threads: 1}
)";

CmdResult run_dtrain(const std::string& args) {
  return run_cmd(kBin + " " + args);
}

// `dtrain eval`'s JSON line for a checkpoint.
std::string eval_line(const std::string& cfg, const std::string& ckpt) {
  const CmdResult r = run_dtrain("eval " + cfg + " --checkpoint " + ckpt + " --log-level warn");
  REQUIRE_MESSAGE(r.exit_code == 0, r.output);
  return r.output;
}

// A run of 1 step at a learning rate too small to move a float32 weight: its checkpoint holds
// the initial weights it started from.
std::string start_from(const std::string& cfg, const std::string& out, const std::string& init,
                       const std::string& sets = "") {
  const CmdResult r = run_dtrain("run " + cfg + " --out " + out + " --set train.init_from=" + init +
                                 " --set optimizer.lr=1e-30 --set train.max_steps=1 " + sets);
  REQUIRE_MESSAGE(r.exit_code == 0, r.output);
  CHECK(contains(r.output, "initial weights from " + init));
  return r.output;
}

// The model tensors of a checkpoint file, renamed by `rename` ("" drops one), with no metadata:
// what PyTorch's safetensors.torch.save_file(model.state_dict()) writes.
void write_state_dict(const std::string& from, const std::string& to,
                      const std::function<std::string(const std::string&)>& rename,
                      const std::vector<std::pair<std::string, std::vector<int64_t>>>& extra = {}) {
  const dtrain::StFile f = dtrain::read_safetensors(from);
  std::vector<dtrain::StTensorRef> refs;
  for (const auto& [name, t] : f.tensors)
    if (!name.starts_with("optim.")) {
      const std::string n = rename(name);
      if (!n.empty()) refs.push_back({n, t.shape, t.data.data()});
    }
  std::vector<std::vector<float>> zeros;
  for (const auto& [name, shape] : extra) {
    int64_t numel = 1;
    for (int64_t d : shape) numel *= d;
    zeros.emplace_back(static_cast<size_t>(numel), 0.0f);
    refs.push_back({name, shape, zeros.back().data()});
  }
  dtrain::write_safetensors(to, refs, {});
}

// The model tensors of checkpoint file `from` written to `to` with the dtype `dtype_of` gives
// each (F32, F16, BF16, F64 or I64; "" drops it), plus an I64 "step" counter, as safetensors.torch
// writes a model held in that precision; `first` (when finite) replaces each tensor's first value.
// Returns the float32 values a reader converting them must get.
std::map<std::string, std::vector<float>> write_as(
    const std::string& from, const std::string& to,
    const std::function<std::string(const std::string&)>& dtype_of,
    double first = std::numeric_limits<double>::quiet_NaN()) {
  const dtrain::StFile f = dtrain::read_safetensors(from);
  std::map<std::string, std::vector<float>> want;
  std::string header = "{", data;
  const auto add = [&](const std::string& name, const std::string& dtype,
                       const std::vector<int64_t>& shape, const std::string& bytes) {
    header += fmt::format(R"({}"{}":{{"dtype":"{}","shape":[{}],"data_offsets":[{},{}]}})",
                          header.size() > 1 ? "," : "", name, dtype, fmt::join(shape, ","),
                          data.size(), data.size() + bytes.size());
    data += bytes;
  };
  for (const auto& [name, t] : f.tensors) {
    const std::string dtype = dtype_of(name);
    if (name.starts_with("optim.") || dtype.empty()) continue;
    std::string bytes;
    std::vector<float>& w = want[name];
    for (size_t i = 0; i < t.data.size(); ++i) {
      const double v = i == 0 && std::isfinite(first) ? first : t.data[i];
      const auto put = [&](auto x) { bytes.append(reinterpret_cast<const char*>(&x), sizeof x); };
      if (dtype == "F16") {
        const auto h = static_cast<_Float16>(v);
        put(h);
        w.push_back(static_cast<float>(h));
      } else if (dtype == "BF16") {  // (truncated, as a cast to bfloat16 need not round)
        const uint32_t bits = std::bit_cast<uint32_t>(static_cast<float>(v)) & 0xffff0000u;
        put(static_cast<uint16_t>(bits >> 16));
        w.push_back(std::bit_cast<float>(bits));
      } else if (dtype == "F64") {
        put(v);
        w.push_back(static_cast<float>(v));
      } else if (dtype == "F32") {
        put(static_cast<float>(v));
        w.push_back(static_cast<float>(v));
      } else {
        put(static_cast<int64_t>(v * 100));
      }
    }
    add(name, dtype, t.shape, bytes);
  }
  add("step", "I64", {}, std::string("\x07\0\0\0\0\0\0\0", 8));
  header += "}";
  std::string file(8, '\0');
  for (int i = 0; i < 8; ++i) file[i] = static_cast<char>((header.size() >> (8 * i)) & 0xff);
  std::ofstream(to, std::ios::binary) << file << header << data;
  return want;
}

std::string latest_file(const std::string& run) {
  std::string name = read_text(run + "/checkpoints/latest");
  name.erase(name.find_last_not_of('\n') + 1);
  return run + "/checkpoints/" + name;
}

}  // namespace

TEST_CASE("train.init_from starts a run from a checkpoint's weights, on any layout") {
  TempDir dir;
  const std::string cfg = dir.write("m.yaml", kMlp);
  const CmdResult a = run_dtrain("run " + cfg + " --out " + dir / "a" + " --log-level warn");
  REQUIRE_MESSAGE(a.exit_code == 0, a.output);
  const std::string want = eval_line(cfg, dir / "a");
  // The run folder, a sharded (fsdp) checkpoint, a file, and layouts other than the file's: the
  // weights as the file held them, the run itself fresh (its step 1).
  const CmdResult sharded = run_dtrain("run " + cfg + " --out " + dir / "s" +
                                       " --set distributed.world_size=2 --set "
                                       "distributed.strategy=fsdp --log-level warn");
  REQUIRE_MESSAGE(sharded.exit_code == 0, sharded.output);
  const std::string want_s = eval_line(cfg, dir / "s");
  CHECK(want_s != want);
  struct Case {
    std::string init, sets, want;
  };
  for (const Case& c :
       {Case{dir / "a", "", want}, Case{dir / "s", "--set distributed.world_size=2", want_s},
        Case{dir / "s/checkpoints", "", want_s},
        Case{latest_file(dir / "a"),
             "--set distributed.world_size=2 --set distributed.strategy=fsdp", want},
        Case{dir / "a", "--set distributed.world_size=2 --set distributed.pipeline.stages=2",
             want}}) {
    CAPTURE(c.init);
    CAPTURE(c.sets);
    std::filesystem::remove_all(dir / "b");
    start_from(cfg, dir / "b", c.init, c.sets);
    CHECK(eval_line(cfg, dir / "b") == c.want);
    CHECK(contains(read_text(dir / "b/summary.json"), "\"steps\": 1"));
  }
  // A resume loads the run's own checkpoint: the file it started from need not be there any more
  // (it was required and read again); an --overwrite of the folder that holds it is refused.
  std::filesystem::copy_file(latest_file(dir / "a"), dir / "base.safetensors");
  std::filesystem::remove_all(dir / "b");
  start_from(cfg, dir / "b", dir / "base.safetensors", "--set train.checkpoint.every_steps=1");
  std::filesystem::remove(dir / "base.safetensors");
  const CmdResult resumed =
      run_dtrain("run " + cfg + " --out " + dir / "b" + " --resume auto --set train.init_from=" +
                 dir / "base.safetensors" + " --set optimizer.lr=1e-30 --set train.max_steps=2");
  CHECK_MESSAGE(resumed.exit_code == 0, resumed.output);
  CHECK_FALSE(contains(resumed.output, "initial weights from"));
  const CmdResult inside = run_dtrain("run " + cfg + " --out " + dir / "a" +
                                      " --overwrite --set train.init_from=" + dir / "a");
  CHECK(inside.exit_code == 2);
  CHECK_MESSAGE(contains(inside.output, "which --overwrite deletes"), inside.output);
}

TEST_CASE("train.init_from takes PyTorch's names and refuses what does not fit, touching nothing") {
  TempDir dir;
  const std::string cfg = dir.write("m.yaml", kMlp);
  REQUIRE(run_dtrain("run " + cfg + " --out " + dir / "a" + " --log-level warn").exit_code == 0);
  const std::string want = eval_line(cfg, dir / "a");
  const std::string ckpt = latest_file(dir / "a");
  // A bare nn.Sequential's state_dict: "0.weight", not "layers.0.weight".
  const std::string bare = dir / "bare.safetensors";
  write_state_dict(ckpt, bare, [](const std::string& n) { return n.substr(7); });
  start_from(cfg, dir / "b", bare);
  CHECK(eval_line(cfg, dir / "b") == want);

  // A missing tensor, another shape, a file of another kind: exit 2, naming it, before the run's
  // folder is touched -- an --overwrite keeps the old run.
  const std::string missing = dir / "missing.safetensors";
  write_state_dict(ckpt, missing,
                   [](const std::string& n) { return n == "layers.2.bias" ? "" : n; });
  const std::string shape = dir / "shape.safetensors";
  write_state_dict(ckpt, shape, [](const std::string& n) { return n == "layers.2.bias" ? "" : n; },
                   {{"layers.2.bias", {9}}});
  const std::string other = dir.write("other.safetensors", "not a safetensors file at all");
  // A NaN weight (the first step failed, blaming the data, after --overwrite cleared the run).
  const std::string nan = dir / "nan.safetensors";
  {
    dtrain::StFile f = dtrain::read_safetensors(ckpt);
    std::vector<dtrain::StTensorRef> refs;
    f.tensors.at("layers.0.weight").data[7] = std::numeric_limits<float>::quiet_NaN();
    for (const auto& [name, t] : f.tensors)
      if (!name.starts_with("optim.")) refs.push_back({name, t.shape, t.data.data()});
    dtrain::write_safetensors(nan, refs, {});
  }
  const std::string summary = read_text(dir / "a/summary.json");
  for (const auto& [file, said] : std::vector<std::pair<std::string, std::string>>{
           {missing,
            "the model's parameter 'layers.2.bias' is not in the file (1 of its 6 "
            "parameters)"},
           {shape, "tensor 'layers.2.bias' is [9] there, the model's 'layers.2.bias' is [8]"},
           {other, "is not a safetensors file"},
           {nan, "tensor 'layers.0.weight' holds a non-finite value (nan at flat index 7)"},
           {dir.path(), "no checkpoint in"}}) {
    CAPTURE(file);
    for (const std::string& out : {dir / "new", dir / "a"}) {
      const CmdResult r = run_dtrain("run " + cfg + " --out " + out + " --overwrite " +
                                     "--set train.init_from=" + file);
      CHECK(r.exit_code == 2);
      CHECK_MESSAGE(contains(r.output, "error: train.init_from '" + file + "'"), r.output);
      CHECK_MESSAGE(contains(r.output, said), r.output);
    }
    CHECK_FALSE(std::filesystem::exists(dir / "new"));
    CHECK(read_text(dir / "a/summary.json") == summary);
  }
  // validate refuses them alike.
  const CmdResult vm = run_dtrain("validate " + cfg + " --set train.init_from=" + missing);
  CHECK(vm.exit_code == 2);
  CHECK_MESSAGE(contains(vm.output, "the model's parameter 'layers.2.bias' is not in the file"),
                vm.output);
  // eval needs no init_from file (the checkpoint holds the weights); run and validate do.
  const CmdResult e = run_dtrain("eval " + cfg + " --checkpoint " + dir / "a" +
                                 " --set train.init_from=" + dir / "x");
  CHECK_MESSAGE(e.exit_code == 0, e.output);
  const CmdResult v = run_dtrain("validate " + cfg + " --set train.init_from=" + dir / "x");
  CHECK(v.exit_code == 2);
  CHECK_MESSAGE(contains(v.output, "train.init_from: '" + dir / "x" + "' does not exist"),
                v.output);
}

TEST_CASE("train.init_from reads PyTorch's half, bfloat16 and double weights as float32") {
  TempDir dir;
  const std::string cfg = dir.write("m.yaml", kMlp);
  REQUIRE(run_dtrain("run " + cfg + " --out " + dir / "a" + " --log-level warn").exit_code == 0);
  const std::string ckpt = latest_file(dir / "a");
  for (const std::string dtype : {"F16", "BF16", "F64"}) {
    CAPTURE(dtype);
    const std::string file = dir / (dtype + ".safetensors");
    const auto want = write_as(ckpt, file, [&](const std::string&) { return dtype; });
    const std::string out = start_from(cfg, dir / dtype, file);
    CHECK_MESSAGE(contains(out, "6 tensor(s) stored as " + dtype + " read as float32 (" +
                                    (dtype == "F64" ? "rounded to nearest" : "exactly") + ")"),
                  out);
    CHECK_MESSAGE(contains(out,
                           "1 tensor(s) in the file are not the model's and were ignored: "
                           "'step'"),
                  out);
    // The run's first checkpoint holds the converted weights (a step at lr 1e-30 moves none).
    const dtrain::StFile got = dtrain::read_safetensors(latest_file(dir / dtype));
    for (const auto& [name, w] : want) {
      CAPTURE(name);
      const std::vector<float>& g = got.tensors.at(name).data;
      REQUIRE(g.size() == w.size());
      for (size_t i = 0; i < g.size(); ++i) REQUIRE(std::fabs(g[i] - w[i]) <= 1e-20f);
    }
  }
  // A parameter stored as integers, and a double beyond float32's range: exit 2, naming them.
  const std::string ints = dir / "ints.safetensors", big = dir / "big.safetensors";
  write_as(ckpt, ints, [](const std::string& n) { return n == "layers.2.bias" ? "I64" : "F32"; });
  write_as(
      ckpt, big, [](const std::string&) { return "F64"; }, 1e300);
  for (const auto& [file, said] : std::vector<std::pair<std::string, std::string>>{
           {ints,
            "tensor 'layers.2.bias' is stored as I64; a parameter is read from F32, F16, BF16 "
            "or F64"},
           {big,
            "tensor 'layers.0.weight' holds a non-finite value (inf at flat index 0, stored as "
            "F64: beyond float32's range)"}}) {
    const CmdResult r =
        run_dtrain("run " + cfg + " --out " + dir / "x" + " --set train.init_from=" + file);
    CHECK(r.exit_code == 2);
    CHECK_MESSAGE(contains(r.output, said), r.output);
    CHECK_FALSE(std::filesystem::exists(dir / "x"));
  }
}

TEST_CASE("train.init_from fills both copies of a tied GPT from either name") {
  // nanoGPT's state_dict saved by safetensors.torch.save_model keeps one name of the tied
  // embedding and head; under PyTorch < 2 it also holds each block's causal-mask buffer.
  TempDir dir;
  std::string text;
  for (int i = 0; i < 400; ++i)
    text += "the quick brown fox jumps over the lazy dog " + std::to_string(i) + "\n";
  const std::string data = dir.write("t.txt", text);
  const std::string cfg =
      dir.write("g.yaml",
                "seed: 4\nmodel: {type: gpt, n_layer: 2, n_head: 2, n_embd: 16, block_size: 16}\n"
                "data: {format: text, train: {path: " +
                    data +
                    "}, batch_size: 8}\noptimizer: {type: adamw, lr: 0.003}\ntrain: {max_steps: "
                    "10}\nruntime: {threads: 1}\n");
  REQUIRE(run_dtrain("run " + cfg + " --out " + dir / "a" + " --log-level warn").exit_code == 0);
  const std::string want = eval_line(cfg, dir / "a");
  // An untied model's file (both names, two tensors) into a tied model: refused, naming the key
  // (it trained untied, and its checkpoints failed to load).
  REQUIRE(run_dtrain("run " + cfg + " --out " + dir / "u" +
                     " --set model.tie_embeddings=false --log-level warn")
              .exit_code == 0);
  const CmdResult untied =
      run_dtrain("run " + cfg + " --out " + dir / "t" + " --set train.init_from=" + dir / "u");
  CHECK(untied.exit_code == 2);
  CHECK_MESSAGE(contains(untied.output, "set model.tie_embeddings: false to start from them"),
                untied.output);
  CHECK_FALSE(std::filesystem::exists(dir / "t"));
  for (const std::string drop : {"transformer.wte.weight", "lm_head.weight"}) {
    CAPTURE(drop);
    const std::string file = dir / "nano.safetensors";
    write_state_dict(latest_file(dir / "a"), file,
                     [&](const std::string& n) { return n == drop ? "" : n; },
                     {{"transformer.h.0.attn.bias", {1, 1, 16, 16}},
                      {"transformer.h.1.attn.bias", {1, 1, 16, 16}}});
    std::filesystem::remove_all(dir / "b");
    const std::string out = start_from(cfg, dir / "b", file,
                                       "--set distributed.world_size=2 "
                                       "--set distributed.tensor_parallel.size=2");
    CHECK(contains(out,
                   "2 tensor(s) in the file are not the model's and were ignored: "
                   "'transformer.h.0.attn.bias', 'transformer.h.1.attn.bias'"));
    CHECK(eval_line(cfg, dir / "b") == want);
  }
}

TEST_CASE("train.init_from says when the data's columns are not those its weights learned") {
  // A dtrain checkpoint records its training inputs; a fine-tune on columns in another order
  // reads them by position: said (a resume refuses it; a fine-tune may mean it).
  TempDir dir;
  std::string ab = "a,b,label\n", ba = "b,a,label\n";
  for (int i = 0; i < 60; ++i) {
    const std::string x = std::to_string(i % 7), y = std::to_string(i % 5);
    ab += x + "," + y + "," + std::to_string(i % 2) + "\n";
    ba += y + "," + x + "," + std::to_string(i % 2) + "\n";
  }
  auto cfg = [&](const std::string& name, const std::string& csv) {
    return dir.write(name + ".yaml", "model: {hidden: [4]}\ndata: {format: csv, train: {path: " +
                                         dir.write(name + ".csv", csv) +
                                         "}, batch_size: 10}\ntrain: {max_steps: 2}\n");
  };
  REQUIRE(run_dtrain("run " + cfg("ab", ab) + " --out " + dir / "a").exit_code == 0);
  const CmdResult same =
      run_dtrain("run " + cfg("ab", ab) + " --out " + dir / "s --set train.init_from=" + dir / "a");
  CHECK_MESSAGE(same.exit_code == 0, same.output);
  CHECK_FALSE(contains(same.output, "reads its inputs by position"));
  const CmdResult swapped =
      run_dtrain("run " + cfg("ba", ba) + " --out " + dir / "b --set train.init_from=" + dir / "a");
  CHECK_MESSAGE(swapped.exit_code == 0, swapped.output);
  CHECK_MESSAGE(contains(swapped.output,
                         "the training data's feature columns are b, a, the model "
                         "was trained on a, b"),
                swapped.output);
}
