// The dtrain binary as users run it: exit codes (0 ok, 2 user error, 1 runtime failure, never a
// signal) and the messages they read.
#include <doctest/doctest.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <map>
#include <sstream>

#include <nlohmann/json.hpp>

#include "checkpoint/safetensors.h"
#include "test_util.h"

using dtrain::testing::CmdResult;
using dtrain::testing::contains;
using dtrain::testing::read_text;
using dtrain::testing::run_cmd;
using dtrain::testing::TempDir;

namespace {

const std::string kBin = DTRAIN_BIN;
const std::string kSrc = DTRAIN_SOURCE_DIR;

CmdResult run_dtrain(const std::string& args) {
  return run_cmd(kBin + " " + args);
}

const char* kTiny = R"(seed: 3
model: {hidden: [16]}
data:
  format: synthetic
  synthetic: {samples: 600, features: 5, classes: 3, noise: 0.3}
  batch_size: 20
optimizer: {type: sgd, lr: 0.1, momentum: 0.9}
train: {epochs: 3, log_every: 10}
runtime: {threads: 1}
)";

}  // namespace

TEST_CASE("help and version exit 0, bad command lines exit 2") {
  for (const char* args :
       {"--help", "run --help", "validate --help", "eval --help", "predict --help", "--version"}) {
    const auto r = run_dtrain(args);
    CHECK_MESSAGE(r.exit_code == 0, args, r.output);
  }
  CHECK(contains(run_dtrain("--help").output, "run"));
  for (const char* args : {"", "frobnicate", "run", "run --bogus x.yaml", "eval x.yaml",
                           "--log-level loud run x.yaml"}) {
    const auto r = run_dtrain(args);
    CHECK_MESSAGE(r.exit_code == 2, args, r.output);
  }
}

TEST_CASE("config errors exit 2 with FILE:LINE:COL, key path and a suggestion") {
  TempDir dir;
  auto r = run_dtrain("validate " + dir / "missing.yaml");
  CHECK(r.exit_code == 2);
  CHECK(contains(r.output, "missing.yaml"));

  const std::string bad_syntax = dir.write("syntax.yaml", "model: {hidden: [1, 2\nseed: 1\n");
  r = run_dtrain("validate " + bad_syntax);
  CHECK(r.exit_code == 2);
  CHECK(contains(r.output, "syntax.yaml:"));

  const std::string typo = dir.write("typo.yaml", std::string(kTiny) + "optimiser: {}\n");
  r = run_dtrain("validate " + typo);
  CHECK(r.exit_code == 2);
  CHECK(contains(r.output, "typo.yaml:10:1"));
  CHECK(contains(r.output, "optimizer"));

  const std::string neg = dir.write("neg.yaml", kTiny);
  r = run_dtrain("validate " + neg + " --set optimizer.lr=-1");
  CHECK(r.exit_code == 2);
  CHECK(contains(r.output, "optimizer.lr"));
  r = run_dtrain("validate " + neg + " --set data.batch_size=0");
  CHECK(r.exit_code == 2);
  CHECK(contains(r.output, "batch_size"));
  r = run_dtrain("validate " + neg + " --set 'model.hidden=[8,8]'");
  CHECK_MESSAGE(r.exit_code == 0, r.output);
  CHECK(contains(r.output, "ok"));
}

TEST_CASE("every shipped config validates") {
  for (const auto& e : std::filesystem::directory_iterator(kSrc + "/configs")) {
    if (e.path().extension() != ".yaml") continue;
    const auto r = run_dtrain("validate " + e.path().string());
    CHECK_MESSAGE(r.exit_code == 0, e.path().string(), r.output);
  }
}

TEST_CASE("run, eval and predict on a tiny synthetic config") {
  TempDir dir;
  const std::string cfg = dir.write("tiny.yaml", kTiny);
  const std::string out = dir / "run";
  auto r = run_dtrain("run " + cfg + " --out " + out + " --log-level warn");
  REQUIRE_MESSAGE(r.exit_code == 0, r.output);
  CHECK(std::filesystem::exists(out + "/summary.json"));
  CHECK(std::filesystem::exists(out + "/metrics.jsonl"));

  r = run_dtrain("eval " + cfg + " --checkpoint " + out + "/checkpoints --log-level warn");
  REQUIRE_MESSAGE(r.exit_code == 0, r.output);
  CHECK(contains(r.output, "\"test_accuracy\""));
  // model.num_classes / input_features spelled out as the data gives them (the run had 0, "from
  // the data") is the same model; another number is refused by the weights' shapes or the data.
  for (const std::string same : {"model.num_classes=3", "model.input_features=5"}) {
    r = run_dtrain("eval " + cfg + " --checkpoint " + out + " --set " + same + " --log-level warn");
    INFO(same);
    CHECK_MESSAGE(r.exit_code == 0, r.output);  // was: "another model config"
  }
  r = run_dtrain("eval " + cfg + " --checkpoint " + out + " --set model.num_classes=4");
  CHECK(r.exit_code == 2);
  CHECK_MESSAGE(contains(r.output, "the model expects [4, "), r.output);
  // Training data that now has a fourth class: the width from the data is named as the cause
  // (the shape error alone blamed the checkpoint, under the config the run used).
  r = run_dtrain("eval " + cfg + " --checkpoint " + out + " --set data.synthetic.classes=4");
  CHECK(r.exit_code == 2);
  CHECK_MESSAGE(contains(r.output, "the output width is the data's label count, now 4"), r.output);
  // A sharded checkpoint words the mismatch its own way; the hint is the same.
  r = run_dtrain("run " + cfg + " --out " + dir / "sharded" + " --log-level warn" +
                 " --set distributed.world_size=2 --set distributed.strategy=fsdp");
  REQUIRE_MESSAGE(r.exit_code == 0, r.output);
  r = run_dtrain("eval " + cfg + " --checkpoint " + dir / "sharded" +
                 " --set data.synthetic.classes=4");
  CHECK(r.exit_code == 2);
  CHECK_MESSAGE(contains(r.output, "the output width is the data's label count, now 4"), r.output);

  // Predict: two rows of 5 features; a 3-class probability row each.
  const std::string in = dir.write("in.csv", "0.1,0.2,0.3,0.4,0.5\n-1,0,1,2,3\n");
  r = run_dtrain("predict " + cfg + " --checkpoint " + out + "/checkpoints --input " + in +
                 " --output " + dir / "pred.csv --log-level warn");
  REQUIRE_MESSAGE(r.exit_code == 0, r.output);
  const std::string pred = read_text(dir / "pred.csv");
  CHECK(pred.rfind("predicted,prob_0,prob_1,prob_2\n", 0) == 0);
  CHECK(std::count(pred.begin(), pred.end(), '\n') == 3);
  // The same rows from standard input (--input -; gzip too), to standard output (--output -);
  // an error names <stdin>.
  const std::string predict = kBin + " predict " + cfg + " --checkpoint " + out +
                              "/checkpoints --log-level warn --input - --output -";
  r = run_cmd("cat " + in + " | " + predict);
  CHECK_MESSAGE(r.output == pred, r.output);
  r = run_cmd("gzip -c " + in + " | " + predict);
  CHECK_MESSAGE(r.output == pred, r.output);
  r = run_cmd("printf '1,2\\n' | " + predict);
  CHECK(r.exit_code == 2);
  CHECK_MESSAGE(contains(r.output, "<stdin>:1: expected 5 feature columns"), r.output);
  CHECK_FALSE(std::filesystem::exists("-"));
  // Nor may it write over the file standard input was redirected from, or standard output's.
  r = run_cmd(predict.substr(0, predict.size() - 11) + " --output " + in + " < " + in);
  CHECK(r.exit_code == 2);
  CHECK_MESSAGE(contains(r.output, "is the same file as --input -"), r.output);
  r = run_cmd("(" + kBin + " predict " + cfg + " --checkpoint " + out + " --input " + in + " 1<>" +
              in + ")");  // (its stderr to run_cmd's, not the file)
  CHECK(r.exit_code == 2);
  CHECK(read_text(in) == "0.1,0.2,0.3,0.4,0.5\n-1,0,1,2,3\n");

  // An output inside a checkpoints folder could replace a checkpoint: refused, nothing written.
  r = run_dtrain("predict " + cfg + " --checkpoint " + out + "/checkpoints --input " + in +
                 " --output " + out + "/checkpoints/step-1.safetensors");
  CHECK(r.exit_code == 2);
  CHECK_MESSAGE(contains(r.output, "is inside a checkpoint folder"), r.output);
  CHECK_FALSE(std::filesystem::exists(out + "/checkpoints/step-1.safetensors"));
  // Nor may it replace what predict reads: its input rows (the file is left as it was).
  const std::string rows = read_text(in);
  r = run_dtrain("predict " + cfg + " --checkpoint " + out + "/checkpoints --input " + in +
                 " --output " + in);
  CHECK(r.exit_code == 2);
  CHECK_MESSAGE(contains(r.output, "is the same file as --input"), r.output);
  CHECK(read_text(in) == rows);
  // Nor the data files the config names (predict reads the training data).
  const std::string train_csv = dir.write("train.csv", "a,b,label\n1,2,0\n3,4,1\n");
  const std::string csv_cfg =
      dir.write("csv.yaml", "model: {hidden: [4]}\ndata: {format: csv, train: {path: " + train_csv +
                                "}}\ntrain: {epochs: 1}\n");
  r = run_dtrain("predict " + csv_cfg + " --checkpoint " + out + "/checkpoints --input " + in +
                 " --output " + train_csv);
  CHECK(r.exit_code == 2);
  CHECK_MESSAGE(contains(r.output, "is the same file as data.train.path"), r.output);
  CHECK(read_text(train_csv) == "a,b,label\n1,2,0\n3,4,1\n");
  // Nor the checkpoint it reads, given as a file outside any checkpoints folder, nor any other
  // safetensors file (weights): the CSV replaced it and exited 0.
  const std::string model = dir / "model.safetensors";
  std::string latest = read_text(out + "/checkpoints/latest");
  latest.erase(latest.find_last_not_of('\n') + 1);
  std::filesystem::copy_file(out + "/checkpoints/" + latest, model);
  const std::string weights = read_text(model);
  r = run_dtrain("predict " + cfg + " --checkpoint " + model + " --input " + in + " --output " +
                 model);
  CHECK(r.exit_code == 2);
  CHECK_MESSAGE(contains(r.output, "is the same file as --checkpoint"), r.output);
  std::filesystem::copy_file(model, dir / "other.safetensors");
  r = run_dtrain("predict " + cfg + " --checkpoint " + model + " --input " + in + " --output " +
                 dir / "other.safetensors");
  CHECK(r.exit_code == 2);
  CHECK_MESSAGE(contains(r.output, "is a safetensors file"), r.output);
  CHECK(read_text(model) == weights);
  CHECK(read_text(dir / "other.safetensors") == weights);

  // Wrong feature count in the predict input: user error naming the line.
  const std::string bad = dir.write("bad.csv", "1,2,3\n");
  r = run_dtrain("predict " + cfg + " --checkpoint " + out + "/checkpoints --input " + bad);
  CHECK(r.exit_code == 2);

  // The checkpoint belongs to another model shape: refused, exit 2, naming the key -- before
  // the model is built, so even one too large for memory is named, not allocated.
  r = run_dtrain("eval " + cfg + " --set 'model.hidden=[8]' --checkpoint " + out +
                 "/checkpoints --log-level warn");
  CHECK(r.exit_code == 2);
  CHECK_MESSAGE(contains(r.output, "model.hidden: [16] -> [8]"), r.output);
  r = run_dtrain("eval " + cfg + " --set 'model.hidden=[100000000000]' --checkpoint " + out +
                 "/checkpoints --log-level warn");
  CHECK(r.exit_code == 2);
  CHECK_MESSAGE(contains(r.output, "model.hidden: [16] -> [100000000000]"), r.output);
  // Same shapes, inputs scaled otherwise than in training: refused too.
  r = run_dtrain("eval " + cfg + " --set data.normalize=none --checkpoint " + out +
                 "/checkpoints --log-level warn");
  CHECK(r.exit_code == 2);
  CHECK_MESSAGE(contains(r.output, "data.normalize: \"auto\" (standardize) -> \"none\""), r.output);
  // `auto` is standardize for this data: naming it is no change (it was refused as one).
  r = run_dtrain("eval " + cfg + " --set data.normalize=standardize --checkpoint " + out +
                 "/checkpoints --log-level warn");
  CHECK_MESSAGE(r.exit_code == 0, r.output);
  // An mlp's dropout > 0 adds layers that renumber the parameters: named, not "no tensor".
  r = run_dtrain("eval " + cfg + " --set model.dropout=0.2 --checkpoint " + out +
                 "/checkpoints --log-level warn");
  CHECK(r.exit_code == 2);
  CHECK_MESSAGE(contains(r.output, "model.dropout: 0.0 -> 0.2"), r.output);

  // A corrupt checkpoint file: refused, exit 2, never a crash.
  const std::string junk =
      dir.write("junk.safetensors", std::string("\xff\xff\xff\xff\x00\x00", 6));
  r = run_dtrain("eval " + cfg + " --checkpoint " + junk);
  CHECK(r.exit_code == 2);
  CHECK(r.signal == 0);

  // --resume auto on a finished run: nothing left to train, same summary steps.
  r = run_dtrain("run " + cfg + " --out " + out + " --resume auto --log-level warn");
  CHECK_MESSAGE(r.exit_code == 0, r.output);
}

TEST_CASE("bad data is a user error, not a crash") {
  TempDir dir;
  const std::string cfg = dir.write("idx.yaml",
                                    "data:\n  format: idx\n  train: {images: nothere.gz, labels: "
                                    "nothere2.gz}\ntrain: {epochs: 1}\n");
  auto r = run_dtrain("run " + cfg + " --out " + dir / "run");
  CHECK(r.exit_code == 2);
  CHECK(contains(r.output, "nothere.gz"));

  const std::string csv = dir.write("d.csv", "a,b,label\n1,2,0\n3,x,1\n");
  const std::string cfg2 = dir.write(
      "csv.yaml", "data:\n  format: csv\n  train: {path: d.csv}\n  csv: {label_column: label}\n");
  r = run_dtrain("run " + cfg2 + " --out " + dir / "run2");
  CHECK(r.exit_code == 2);
  CHECK(contains(r.output, "d.csv"));
  CHECK(contains(r.output, "3"));  // the line number
}

TEST_CASE("the smoke config trains as CI runs it") {
  TempDir dir;
  const auto r =
      run_dtrain("run " + kSrc + "/configs/smoke.yaml --out " + dir / "smoke --log-level warn");
  REQUIRE_MESSAGE(r.exit_code == 0, r.output);
  const auto s = nlohmann::json::parse(read_text(dir / "smoke/summary.json"));
  CHECK(s["test_accuracy"].get<double>() > 0.9);
}

TEST_CASE("a run with its standard streams closed writes its log to none of its files") {
  // The first files opened took descriptors 1 and 2, so the log went into metrics.jsonl (and
  // `dtrain plot` refused it), and the run exited 1.
  TempDir dir;
  const auto r = run_cmd("exec 0<&- 1>&- 2>&-; " + kBin + " run " + kSrc + "/configs/smoke.yaml" +
                         " --out " + dir / "run; echo rc=$? > " + dir / "rc");
  INFO(r.output);
  CHECK(read_text(dir / "rc") == "rc=0\n");
  std::ifstream in(dir / "run/metrics.jsonl");
  int lines = 0;
  for (std::string line; std::getline(in, line); ++lines)
    CHECK_MESSAGE(nlohmann::json::accept(line), line);
  CHECK(lines > 0);
  // A command whose results go to standard output says they could not be written (they were
  // lost with exit 0); a closed standard input reads as empty (a library's descriptor, taken
  // before main, was read as it: "Resource temporarily unavailable").
  const std::string eval =
      kBin + " eval " + kSrc + "/configs/smoke.yaml --checkpoint " + dir / "run";
  run_cmd("(" + eval + " >&- 2>" + dir / "err; echo rc=$? > " + dir / "rc2)");
  CHECK(read_text(dir / "rc2") == "rc=1\n");
  CHECK(contains(read_text(dir / "err"), "error: writing to standard output failed"));
  const auto in_closed = run_cmd(kBin + " predict " + kSrc + "/configs/smoke.yaml --checkpoint " +
                                 dir / "run" + " --input - <&-");
  CHECK(in_closed.exit_code == 2);
  CHECK_MESSAGE(contains(in_closed.output, "error: empty input: '<stdin>' has no rows"),
                in_closed.output);
}

TEST_CASE("predict and eval: non-finite outputs are refused, input rows are all predicted") {
  TempDir dir;
  // Three well-separated classes of 2 features; a header line, as training files often have.
  std::string train = "a,b,label\n", test = "a,b,label\n";
  for (int i = 0; i < 90; ++i) {
    const int c = i % 3;
    const std::string row = std::to_string(2 * c + 0.01 * (i % 7)) + "," +
                            std::to_string(-c + 0.02 * (i % 5)) + "," + std::to_string(c) + "\n";
    (i < 60 ? train : test) += row;
  }
  dir.write("train.csv", train);
  dir.write("test.csv", test);
  const std::string cfg = dir.write("csv.yaml", R"(seed: 1
model: {hidden: [8]}
data: {format: csv, train: {path: train.csv}, test: {path: test.csv}, batch_size: 10,
       csv: {header: true}}
optimizer: {type: sgd, lr: 0.1}
train: {epochs: 2}
runtime: {threads: 1}
)");
  const std::string run = dir / "run";
  auto r = run_dtrain("run " + cfg + " --out " + run + " --log-level warn");
  REQUIRE_MESSAGE(r.exit_code == 0, r.output);
  const std::string ckpt = " --checkpoint " + run + " --log-level warn";

  // header: true describes the training files: predict's input rows are all predicted (a first
  // row of numbers is data), in batches of eval_batch_size with the same results.
  const std::string in = dir.write("in.csv", "0,0\n4,-2\n2,-1\n");
  r = run_dtrain("predict " + cfg + ckpt + " --input " + in);
  REQUIRE_MESSAGE(r.exit_code == 0, r.output);
  CHECK(std::count(r.output.begin(), r.output.end(), '\n') == 4);
  const auto batched =
      run_dtrain("predict " + cfg + ckpt + " --input " + in + " --set data.eval_batch_size=2");
  CHECK(batched.output == r.output);
  // header: false (training files without one): an input's header row is still skipped, not
  // refused as a non-number.
  dir.write("train_nohdr.csv", train.substr(train.find('\n') + 1));
  dir.write("test_nohdr.csv", test.substr(test.find('\n') + 1));
  const std::string named = dir.write("named.csv", "a,b\n0,0\n4,-2\n2,-1\n");
  const auto nohdr =
      run_dtrain("predict " + cfg + ckpt + " --input " + named +
                 " --set data.csv.header=false --set data.train.path=" + dir / "train_nohdr.csv" +
                 " --set data.test.path=" + dir / "test_nohdr.csv");
  CHECK_MESSAGE(nohdr.output == r.output, nohdr.output);

  // Finite input whose outputs overflow: the row is named, exit 2, no NaN prediction.
  const std::string huge = dir.write("huge.csv", "1,1\n3e38,-3e38\n");
  r = run_dtrain("predict " + cfg + ckpt + " --input " + huge);
  CHECK(r.exit_code == 2);
  CHECK_MESSAGE(contains(r.output, "row 2 (1-based, of 2 data rows) gives non-finite outputs"),
                r.output);
  CHECK_FALSE(contains(r.output, "nan"));
  const std::string test_huge = dir.write("test_huge.csv", "a,b,label\n1,1,0\n3e38,-3e38,1\n");
  r = run_dtrain("eval " + cfg + ckpt + " --set data.test.path=" + test_huge);
  CHECK(r.exit_code == 2);
  // The file and its data row are named (it said "test sample 1 (0-based, of 2)" alone).
  CHECK_MESSAGE(contains(r.output, "test sample 1 (0-based, of 2: data row 2 of '" + test_huge +
                                       "') gives a non-finite output"),
                r.output);
  // A label only the test data has (3; the checkpoint's outputs are 0..2) is named, not just
  // the checkpoint's mismatching shapes, and no model is built for it.
  const std::string test_new = dir.write("test_new.csv", "a,b,label\n1,1,0\n2,2,3\n");
  r = run_dtrain("eval " + cfg + ckpt + " --set data.test.path=" + test_new);
  CHECK(r.exit_code == 2);
  CHECK_MESSAGE(contains(r.output, "data.test has label 3, above the labels 0..2 of checkpoint"),
                r.output);
  CHECK_FALSE(contains(r.output, "the model gets 4 outputs"));
  // In a run, the evaluation reports neither loss nor accuracy, and says why.
  r = run_dtrain("run " + cfg + " --out " + dir / "run2" + " --set data.test.path=" + test_huge +
                 " --set train.max_steps=2");
  CHECK_MESSAGE(r.exit_code == 0, r.output);
  CHECK(contains(r.output, "the test loss is not finite"));
  const auto s = nlohmann::json::parse(read_text(dir / "run2/summary.json"));
  CHECK(s["test_loss"].is_null());
  CHECK(s["test_accuracy"].is_null());
}

TEST_CASE("a train record's loss covers every step since the previous record, epoch ends too") {
  TempDir dir;
  // 480 training samples (the rest is the test split): 24 steps of 20 per epoch.
  const std::string cfg = dir.write("tiny.yaml", kTiny);
  auto losses = [&](int every) {
    const std::string out = dir / ("every" + std::to_string(every));
    const auto r =
        run_dtrain("run " + cfg + " --out " + out + " --set train.epochs=2" +
                   " --set train.log_every=" + std::to_string(every) + " --log-level warn");
    REQUIRE_MESSAGE(r.exit_code == 0, r.output);
    std::map<int64_t, double> m;
    std::istringstream in(read_text(out + "/metrics.jsonl"));
    for (std::string line; std::getline(in, line);) {
      const auto j = nlohmann::json::parse(line);
      if (j["kind"] == "train") m[j["step"].get<int64_t>()] = j["loss"].get<double>();
    }
    return m;
  };
  const auto each = losses(1), seven = losses(7);
  REQUIRE(each.size() == 48);
  // Records at 7, 14, ..., 42 and the last step 48; the one at 28 spans the epoch end at 24.
  int64_t prev = 0;
  for (const auto& [step, loss] : seven) {
    double sum = 0.0;
    for (int64_t s = prev + 1; s <= step; ++s) sum += each.at(s);
    CAPTURE(step);
    CHECK(loss == doctest::Approx(sum / static_cast<double>(step - prev)).epsilon(1e-5));
    prev = step;
  }
  CHECK(prev == 48);
}

TEST_CASE("a resume that keeps fewer optimizer buffers than its checkpoint drops the rest") {
  // DiLoCo (local_sgd.outer_lr) or momentum turned off since the checkpoint: its extra buffers
  // are dropped and the changed key is named in the resume's warning. A one-file checkpoint was
  // refused ("holds the optimizer state [momentum, outer_momentum], this run keeps [momentum]")
  // while a sharded one resumed.
  TempDir dir;
  const std::string cfg = dir.write("tiny.yaml", kTiny);
  const std::string diloco =
      " --set distributed.world_size=2 --set distributed.strategy=local_sgd"
      " --set distributed.local_sgd.sync_every=2"
      " --set distributed.local_sgd.outer_lr=0.7 --set train.max_steps=4";
  struct Case {
    std::string base, resume_sets, key;
  };
  for (const Case& c : {
           Case{diloco, " --set distributed.world_size=2", "distributed.local_sgd.outer_lr"},
           Case{diloco, " --set distributed.world_size=2 --set distributed.strategy=local_sgd",
                "distributed.local_sgd.outer_lr"},
           Case{diloco + " --set 'optimizer={type: adam, lr: 0.01}'",
                " --set distributed.world_size=2 --set 'optimizer={type: adam, lr: 0.01}'",
                "distributed.local_sgd.outer_lr"},
           Case{" --set train.max_steps=4", " --set optimizer.momentum=0", "optimizer.momentum"},
       }) {
    CAPTURE(c.base);
    CAPTURE(c.resume_sets);
    const std::string from = dir / "from", to = dir / "to";
    auto r = run_dtrain("run " + cfg + " --overwrite --out " + from + c.base + " --log-level warn");
    REQUIRE_MESSAGE(r.exit_code == 0, r.output);
    r = run_dtrain("run " + cfg + " --out " + to + " --resume " + from + c.resume_sets +
                   " --set train.max_steps=8 --log-level warn 2>&1");
    CHECK_MESSAGE(r.exit_code == 0, r.output);
    CHECK_MESSAGE(contains(r.output, c.key), r.output);
    std::filesystem::remove_all(to);
  }
}

TEST_CASE("a checkpoint lacking a buffer its optimizer always keeps is named as altered") {
  // An AdamW file without exp_avg_sq (checksums made anew) was blamed on optimizer.momentum or
  // DiLoCo's outer_lr going from 0 to > 0, which neither did.
  TempDir dir;
  const std::string cfg = dir.write("tiny.yaml", kTiny);
  auto r = run_dtrain(
      "run " + cfg + " --out " + dir / "a" +
      " --set 'optimizer={type: adamw, lr: 0.01}' --set train.max_steps=3 --log-level warn");
  REQUIRE_MESSAGE(r.exit_code == 0, r.output);
  const std::string file = dir / "a/checkpoints/step-3.safetensors";
  const dtrain::StFile f = dtrain::read_safetensors(file);
  std::vector<dtrain::StTensorRef> kept;
  for (const auto& [name, t] : f.tensors)
    if (!name.starts_with("optim.exp_avg_sq.")) kept.push_back({name, t.shape, t.data.data()});
  REQUIRE(kept.size() < f.tensors.size());
  dtrain::write_safetensors(dir / "cut.safetensors", kept, f.metadata);
  r = run_dtrain(
      "run " + cfg + " --out " + dir / "b" + " --resume " + dir / "cut.safetensors" +
      " --set 'optimizer={type: adamw, lr: 0.01}' --set train.max_steps=5 --log-level warn");
  CHECK(r.exit_code == 2);
  CHECK_MESSAGE(
      contains(r.output,
               "holds the optimizer state [exp_avg], this run keeps [exp_avg, "
               "exp_avg_sq]: the file was altered, or not written by a dtrain run of adamw (it "
               "lacks [exp_avg_sq])"),
      r.output);
}

TEST_CASE("a resume that would need optimizer state the checkpoint lacks names both states") {
  TempDir dir;
  const std::string cfg = dir.write("tiny.yaml", kTiny);
  auto r = run_dtrain("run " + cfg + " --out " + dir / "plain" +
                      " --set optimizer.momentum=0 --set train.max_steps=5 --log-level warn");
  REQUIRE_MESSAGE(r.exit_code == 0, r.output);
  r = run_dtrain("run " + cfg + " --out " + dir / "mom" + " --resume " + dir / "plain" +
                 " --set train.max_steps=10 --log-level warn");
  CHECK(r.exit_code == 2);
  CHECK_MESSAGE(contains(r.output, "holds the optimizer state [], this run keeps [momentum]"),
                r.output);
  CHECK(contains(r.output, "optimizer.momentum or distributed.local_sgd.outer_lr"));
  // A file of weights alone whose run kept momentum (its state dropped): said so, not blamed on a
  // momentum setting that did not change.
  r = run_dtrain("run " + cfg + " --out " + dir / "m" +
                 " --set train.max_steps=5 --log-level warn");
  REQUIRE_MESSAGE(r.exit_code == 0, r.output);
  {
    const dtrain::StFile f = dtrain::read_safetensors(dir / "m/checkpoints/step-5.safetensors");
    std::vector<dtrain::StTensorRef> refs;
    for (const auto& [name, t] : f.tensors)
      if (name.rfind("optim.", 0) != 0) refs.push_back({name, t.shape, t.data.data()});
    dtrain::write_safetensors(dir / "weights.safetensors", refs, f.metadata);
  }
  r = run_dtrain("run " + cfg + " --out " + dir / "w" + " --resume " + dir / "weights.safetensors" +
                 " --set train.max_steps=10 --log-level warn");
  CHECK(r.exit_code == 2);
  CHECK_MESSAGE(contains(r.output,
                         "holds no optimizer state (sgd keeps [momentum]): a "
                         "weights-only file, which a resume cannot continue from"),
                r.output);
  // The refused resume leaves no folder behind where there was none (an empty one with an empty
  // checkpoints/ before); a folder that existed stays.
  CHECK_FALSE(std::filesystem::exists(dir / "mom"));
  std::filesystem::create_directories(dir / "kept");
  r = run_dtrain("run " + cfg + " --out " + dir / "kept" + " --resume " + dir / "plain" +
                 " --set train.max_steps=10 --log-level warn");
  CHECK(r.exit_code == 2);
  CHECK(std::filesystem::exists(dir / "kept"));
}

TEST_CASE("predict: an input whose first row equals numeric training column names is asked about") {
  // Training columns named 0 and 1 (a pandas header): an input row "0,1" is both those names and
  // data. Taken as the header, it was dropped silently, shifting every prediction against its
  // input row; now auto refuses, and --input-header says which it is.
  TempDir dir;
  const std::string train = dir.write("bin.csv", "0,1,label\n0,1,0\n1,0,1\n1,1,1\n0,0,0\n");
  const std::string cfg =
      dir.write("c.yaml", "model: {hidden: [4]}\ndata: {format: csv, train: {path: " + train +
                              "}, csv: {header: true}, test_fraction: 0, batch_size: 2}\n"
                              "train: {max_steps: 1}\n");
  auto r = run_dtrain("run " + cfg + " --out " + dir / "r" + " --log-level warn");
  REQUIRE_MESSAGE(r.exit_code == 0, r.output);
  const std::string in = dir.write("in.csv", "0,1\n1,0\n1,1\n");
  const std::string base = "predict " + cfg + " --checkpoint " + dir / "r" + " --input " + in;
  r = run_dtrain(base + " --log-level warn");
  CHECK(r.exit_code == 2);
  CHECK_MESSAGE(contains(r.output,
                         "the first row is both the training data's column names and a "
                         "row of numbers: say whether it is a header (--input-header "
                         "true: it is skipped) or data (--input-header false)"),
                r.output);
  const auto lines = [](const std::string& s) { return std::count(s.begin(), s.end(), '\n'); };
  r = run_cmd(kBin + " " + base + " --input-header false --log-level warn");
  CHECK(r.exit_code == 0);
  CHECK(lines(r.output) == 4);  // the column line and 3 predictions
  r = run_cmd(kBin + " " + base + " --input-header true --log-level warn");
  CHECK(r.exit_code == 0);
  CHECK(lines(r.output) == 3);
  // Told there is no header, a row of names is refused with what would skip it.
  const std::string named = dir.write("named.csv", "x,y\n1,0\n");
  r = run_dtrain("predict " + cfg + " --checkpoint " + dir / "r" + " --input " + named +
                 " --input-header false --log-level warn");
  CHECK(r.exit_code == 2);
  CHECK_MESSAGE(contains(r.output,
                         "\"x\" is not a number; the first row looks like a header: "
                         "--input-header true skips it"),
                r.output);
}

TEST_CASE("eval and predict scale inputs as training did, whatever the data files hold now") {
  // The checkpoint stores the training data's normaliser. Refitted from the files at eval and
  // predict time, a training file that grew after training changed every prediction silently.
  TempDir dir;
  std::string rows = "a,b,label\n";
  for (int i = 0; i < 40; ++i)
    rows += std::to_string(i % 7) + "," + std::to_string((i * 3) % 5) + "," +
            std::to_string(i % 2) + "\n";
  const std::string train = dir.write("train.csv", rows);
  const std::string cfg =
      dir.write("c.yaml", "model: {hidden: [4]}\ndata: {format: csv, train: {path: " + train +
                              "}, test_fraction: 0.25, batch_size: 4}\ntrain: {max_steps: 3}\n");
  const std::string in = dir.write("in.csv", "1,2\n6,0\n");
  for (const std::string layout : {"",
                                   " --set distributed.world_size=2 --set "
                                   "distributed.strategy=fsdp"}) {
    CAPTURE(layout);
    const std::string out = dir / ("r" + std::to_string(layout.size()));
    auto r = run_dtrain("run " + cfg + layout + " --out " + out + " --log-level warn");
    REQUIRE_MESSAGE(r.exit_code == 0, r.output);
    const std::string predict = "predict " + cfg + " --checkpoint " + out + " --input " + in;
    const std::string eval = "eval " + cfg + " --checkpoint " + out;
    const auto before = run_cmd(kBin + " " + predict + " --log-level error");
    const auto eval_before = run_cmd(kBin + " " + eval + " --log-level error");
    REQUIRE(before.exit_code == 0);
    REQUIRE(eval_before.exit_code == 0);
    // The training file grows (other statistics): the same predictions, with a warning.
    dir.write("train.csv", rows + "100,90,1\n-50,40,0\n");
    r = run_dtrain(predict + " --log-level warn");
    CHECK(r.exit_code == 0);
    CHECK(contains(r.output, "the training data's statistics now differ"));
    const auto after = run_cmd(kBin + " " + predict + " --log-level error");
    CHECK(after.output == before.output);
    // A resume trains on, warned that the weights learned with other statistics.
    r = run_dtrain("run " + cfg + layout + " --out " + out +
                   " --resume auto --set train.max_steps=4 --log-level warn");
    CHECK(r.exit_code == 0);
    CHECK(contains(r.output, "training continues on inputs scaled by the data's own"));
    dir.write("train.csv", rows);
    // Another seed holds out another split: evaluated, scaled as training did, and warned about.
    r = run_dtrain(eval + " --set seed=99 --log-level warn");
    CHECK(r.exit_code == 0);
    CHECK(contains(r.output, "the training data's statistics now differ"));
  }
}

TEST_CASE("a warm-up longer than the run is said: the rate never reaches optimizer.lr") {
  // It was accepted without a word: the cosine decay never started, the rate never got to lr.
  TempDir dir;
  const std::string cfg = std::string(DTRAIN_SOURCE_DIR) + "/configs/smoke.yaml";
  const std::string run = "run " + cfg + " --set train.epochs=0 --set train.max_steps=10 --out ";
  auto r = run_dtrain(run + dir / "a" + " --set optimizer.schedule.warmup_steps=50 " +
                      "--set optimizer.schedule.type=cosine --log-level warn");
  CHECK_MESSAGE(r.exit_code == 0, r.output);
  CHECK_MESSAGE(contains(r.output,
                         "optimizer.schedule.warmup_steps 50 is more than the run's 10 steps: the "
                         "learning rate rises to 0.2 x optimizer.lr at most and the schedule's "
                         "decay after it never starts"),
                r.output);
  r = run_dtrain(run + dir / "b" + " --set optimizer.schedule.warmup_steps=10 --log-level warn");
  CHECK_MESSAGE(r.exit_code == 0, r.output);
  CHECK_FALSE(contains(r.output, "warmup_steps"));
}

TEST_CASE("eval of a held-out split drawn otherwise than in training says so") {
  // A seed sweep's checkpoint evaluated without its seed scored rows it had trained on, silently.
  TempDir dir;
  const std::string cfg = std::string(DTRAIN_SOURCE_DIR) + "/configs/smoke.yaml";
  const std::string run = cfg + " --set train.epochs=0 --set train.max_steps=5";
  auto r = run_dtrain("run " + run + " --out " + dir / "r" + " --log-level warn");
  REQUIRE_MESSAGE(r.exit_code == 0, r.output);
  const std::string eval = "eval " + run + " --checkpoint " + dir / "r";
  r = run_dtrain(eval);
  CHECK_MESSAGE(r.exit_code == 0, r.output);
  CHECK_FALSE(contains(r.output, "held-out test split"));
  r = run_dtrain(eval + " --set seed=99 --set data.test_fraction=0.3");
  CHECK_MESSAGE(r.exit_code == 0, r.output);
  CHECK_MESSAGE(contains(r.output,
                         "the held-out test split is drawn otherwise than in the run "
                         "checkpoint '"),
                r.output);
  CHECK(contains(r.output, "\n  seed: 7 -> 99\n  data.test_fraction: 0.2 -> 0.3\n"));
  CHECK(contains(r.output, "the rows evaluated are not the training's held-out rows (synthetic"));
  // A smaller fraction holds out part of the same rows (the seeded order's first): no warning.
  r = run_dtrain(eval + " --set data.test_fraction=0.1");
  CHECK_MESSAGE(r.exit_code == 0, r.output);
  CHECK_FALSE(contains(r.output, "held-out test split"));
}

TEST_CASE("eval with data.test needs no training files: the checkpoint's normaliser scales") {
  // `dtrain eval` refused a config whose data.train was not on the evaluating machine, though
  // it reads only the test files and the checkpoint stores the training's normaliser.
  TempDir dir;
  std::string train = "a,b,label\n", test = "a,b,label\n";
  for (int i = 0; i < 90; ++i) {
    const int y = i % 3;
    (i < 60 ? train : test) += std::to_string(10 * y + i % 7) + "," +
                               std::to_string(100 + 5 * y - i % 5) + "," + std::to_string(y) + "\n";
  }
  dir.write("train.csv", train);
  dir.write("test.csv", test);
  const std::string cfg = dir.write(
      "c.yaml", "seed: 3\nmodel: {type: mlp, hidden: [8]}\ndata:\n  format: csv\n  train: {path: " +
                    dir / "train.csv" + "}\n  test: {path: " + dir / "test.csv" +
                    "}\n  batch_size: 16\noptimizer: {type: sgd, lr: 0.1}\ntrain: {epochs: 3}\n"
                    "runtime: {threads: 1}\n");
  auto r = run_dtrain("run " + cfg + " --out " + dir / "r" + " --log-level warn");
  REQUIRE_MESSAGE(r.exit_code == 0, r.output);
  const auto last_line = [](const std::string& out) {
    const size_t end = out.find_last_not_of('\n');
    return out.substr(out.rfind('\n', end) + 1, end - out.rfind('\n', end));
  };
  r = run_dtrain("eval " + cfg + " --checkpoint " + dir / "r" + " --log-level warn");
  REQUIRE_MESSAGE(r.exit_code == 0, r.output);
  const std::string with_train = last_line(r.output);
  CHECK(contains(with_train, "\"samples\":30"));
  // predict likewise (its output width and column names from the test files and checkpoint).
  dir.write("in.csv", "a,b\n1,101\n12,104\n25,109\n");
  const std::string predict = "predict " + cfg + " --checkpoint " + dir / "r" + " --input " +
                              dir / "in.csv" + " --log-level warn --output ";
  r = run_dtrain(predict + dir / "p1.csv");
  REQUIRE_MESSAGE(r.exit_code == 0, r.output);
  // (a model trained under mse, for the predict check below)
  r = run_dtrain("run " + cfg + " --out " + dir / "mse" + " --set model.loss=mse --log-level warn");
  REQUIRE_MESSAGE(r.exit_code == 0, r.output);
  r = run_dtrain("predict " + cfg + " --checkpoint " + dir / "mse" + " --input " + dir / "in.csv" +
                 " --log-level warn --output " + dir / "p4.csv" + " --set model.loss=mse");
  CHECK_MESSAGE(r.exit_code == 0, r.output);
  CHECK(read_text(dir / "p4.csv").rfind("predicted,out_0,out_1,out_2\n", 0) == 0);
  // With the training files here too, a test label above the checkpoint's outputs is named as
  // such (the model was built for the test labels and the checkpoint blamed).
  r = run_dtrain("eval " + cfg + " --checkpoint " + dir / "r" + " --set data.test.path=" +
                 dir.write("above0.csv", "a,b,label\n1,101,0\n30,115,3\n"));
  CHECK(r.exit_code == 2);
  CHECK_MESSAGE(contains(r.output, "data.test has label 3, above the labels 0..2 of checkpoint"),
                r.output);
  CHECK_FALSE(contains(r.output, "the model gets 4 outputs"));
  std::filesystem::remove(dir / "train.csv");
  r = run_dtrain("eval " + cfg + " --checkpoint " + dir / "r" + " --log-level warn");
  CHECK_MESSAGE(r.exit_code == 0, r.output);
  CHECK(last_line(r.output) == with_train);
  r = run_dtrain(predict + dir / "p2.csv");
  CHECK_MESSAGE(r.exit_code == 0, r.output);
  CHECK(read_text(dir / "p2.csv") == read_text(dir / "p1.csv"));
  CHECK(contains(read_text(dir / "p1.csv"), "predicted,prob_0,prob_1,prob_2\n"));
  // The loss the model was trained with decides what the outputs are (model.loss may differ
  // here): logits, as probabilities. A model trained under mse: its outputs as they are.
  r = run_dtrain(predict + dir / "p3.csv" + " --set model.loss=mse");
  CHECK_MESSAGE(r.exit_code == 0, r.output);
  CHECK(read_text(dir / "p3.csv").rfind("predicted,prob_0,prob_1,prob_2\n", 0) == 0);
  // The output width is the checkpoint's: test labels without the top class (2) were a model of
  // 2 outputs, refused as another model; a label above it is named.
  std::string no_top = "a,b,label\n1,101,0\n12,104,1\n", above = no_top + "30,115,3\n";
  dir.write("no_top.csv", no_top);
  dir.write("above.csv", above);
  dir.write("zeros.csv", "a,b,label\n1,101,0\n2,102,0\n");  // (one class: was "a single class")
  r = run_dtrain("eval " + cfg + " --checkpoint " + dir / "r" +
                 " --log-level warn --set data.test.path=" + dir / "zeros.csv");
  CHECK_MESSAGE(r.exit_code == 0, r.output);
  r = run_dtrain("eval " + cfg + " --checkpoint " + dir / "r" +
                 " --log-level warn --set data.test.path=" + dir / "no_top.csv");
  CHECK_MESSAGE(r.exit_code == 0, r.output);
  CHECK(contains(last_line(r.output), "\"samples\":2"));
  r = run_dtrain("eval " + cfg + " --checkpoint " + dir / "r" +
                 " --log-level warn --set data.test.path=" + dir / "above.csv");
  CHECK(r.exit_code == 2);
  CHECK_MESSAGE(contains(r.output, "data.test has label 3, above the labels 0..2 of checkpoint"),
                r.output);
  // run still needs them, named.
  r = run_dtrain("validate " + cfg);
  CHECK(r.exit_code == 2);
  CHECK(contains(r.output, "data.train.path: '" + dir / "train.csv" + "' does not exist"));
}

TEST_CASE("eval names the training's data by what it reads: a symlink or '..' is the same file") {
  // The held-out split's check compared the paths as spelt: the same file through a symlinked
  // folder, '..' or '//' was reported as other training data, with optimistic figures.
  TempDir dir;
  std::string rows = "a,b,label\n";
  for (int i = 0; i < 90; ++i)
    rows +=
        std::to_string(i % 7) + "," + std::to_string(i % 5) + "," + std::to_string(i % 3) + "\n";
  std::filesystem::create_directories(dir / "data");
  dir.write("data/train.csv", rows);
  dir.write("other.csv", rows);
  std::filesystem::create_directory_symlink(dir / "data", dir / "link");
  const std::string cfg = dir.write(
      "c.yaml", "seed: 3\nmodel: {type: mlp, hidden: [8]}\ndata:\n  format: csv\n  train: {path: " +
                    dir / "data/train.csv" +
                    "}\n  test_fraction: 0.2\n  batch_size: 16\noptimizer: {type: sgd, lr: 0.1}\n"
                    "train: {epochs: 1}\nruntime: {threads: 1}\n");
  auto r = run_dtrain("run " + cfg + " --out " + dir / "r" + " --log-level warn");
  REQUIRE_MESSAGE(r.exit_code == 0, r.output);
  const std::string eval = "eval " + cfg + " --checkpoint " + dir / "r" + " --set data.train.path=";
  for (const std::string& same : {dir / "link/train.csv", dir / "data/../data//train.csv"}) {
    r = run_dtrain(eval + same);
    CHECK_MESSAGE(r.exit_code == 0, r.output);
    CHECK_MESSAGE(!contains(r.output, "held-out test split"), same, "\n", r.output);
  }
  r = run_dtrain(eval + dir / "other.csv");  // another file (its contents are not compared)
  CHECK_MESSAGE(r.exit_code == 0, r.output);
  CHECK_MESSAGE(contains(r.output, "the held-out test split is drawn otherwise"), r.output);
  // The key as it is spelled (it printed data.train: ["","",["..."]] -> ...).
  CHECK_MESSAGE(
      contains(r.output, "\n  data.train.path: [\"" + dir / "data/train.csv" + "\"] -> [\""),
      r.output);
}
