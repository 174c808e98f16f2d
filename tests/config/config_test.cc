// lib/config: YAML parsing, overrides, validation messages, path resolution, JSON and hash.
#include <doctest/doctest.h>

#include <cmath>

#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "config/config.h"
#include "config_test_util.h"
#include "util/check.h"

namespace dtrain {
namespace {

namespace fs = std::filesystem;

using config_test::error_of;
using config_test::kSynthetic;
using config_test::set_error;

const char* const kCsv = "data: {format: csv, train: {path: /d/train.csv}}\n";

// A fresh folder under the system temp dir, removed with everything in it on destruction.
class TempDir {
 public:
  TempDir() {
    static int counter = 0;
    path_ = fs::temp_directory_path() /
            ("dtrain_config_test_" + std::to_string(::getpid()) + "_" + std::to_string(counter++));
    fs::create_directories(path_);
  }
  ~TempDir() {
    std::error_code ec;
    fs::remove_all(path_, ec);
  }
  const fs::path& path() const { return path_; }
  fs::path write(const std::string& rel, const std::string& text) const {
    const fs::path p = path_ / rel;
    fs::create_directories(p.parent_path());
    std::ofstream(p) << text;
    return p;
  }

 private:
  fs::path path_;
};

const char* const kFmnist = R"(seed: 42
model: {type: mlp, hidden: [512, 512], activation: relu}
data: {format: idx, train: {images: /ds/train-images.gz, labels: /ds/train-labels.gz}, test: {images: /ds/t10k-images.gz, labels: /ds/t10k-labels.gz}, batch_size: 128, shuffle: true}
optimizer: {type: sgd, lr: 0.05, momentum: 0.9}
train: {epochs: 10, max_steps: 0, log_every: 100, checkpoint: {every_steps: 0, keep_last: 3}}
distributed: {backend: inproc, world_size: 1, strategy: ddp}
runtime: {threads: 0}
)";

// Every key of the schema except those of other option choices (SGD's and the step schedule's:
// this has adamw and cosine), all with non-default values.
const char* const kEveryKey = R"(seed: 7
model:
  type: mlp
  complexity: ""
  hidden: [64, 32]
  activation: gelu
  dropout: 0.25
  layer_norm: true
  init: xavier
  loss: mse
  input_features: 20
  num_classes: 3
data:
  format: csv
  train: {path: /d/train.csv}
  test: {path: /d/test.csv}
  batch_size: 64
  eval_batch_size: 500
  shuffle: false
  drop_last: true
  normalize: scale
  csv: {header: true, label_column: label, delimiter: ";"}
optimizer:
  type: adamw
  lr: 0.003
  weight_decay: 0.01
  beta1: 0.8
  beta2: 0.99
  eps: 1.0e-6
  scale_lr: linear
  clip_grad_norm: 1.5
  schedule: {type: cosine, warmup_steps: 100, min_lr: 0.0001}
train:
  epochs: 3
  max_steps: 1000
  log_every: 10
  eval_every: 200
  grad_accum_steps: 2
  checkpoint: {every_steps: 500, keep_last: 2}
distributed: {backend: grpc, world_size: 4, strategy: ddp}
runtime: {threads: 2}
)";

}  // namespace

TEST_CASE("a typical idx config parses to the values written") {
  const Config c = parse_config(kFmnist, "fmnist.yaml");
  CHECK(c.seed == 42);
  CHECK(c.model.type == ModelType::kMlp);
  CHECK(c.model.hidden == std::vector<int64_t>{512, 512});
  CHECK(c.model.activation == Activation::kRelu);
  CHECK(c.data.format == DataFormat::kIdx);
  CHECK(c.data.train.images == "/ds/train-images.gz");
  CHECK(c.data.train.labels == "/ds/train-labels.gz");
  CHECK(c.data.test.images == "/ds/t10k-images.gz");
  CHECK(c.data.test.labels == "/ds/t10k-labels.gz");
  CHECK(c.data.batch_size == 128);
  CHECK(c.data.shuffle);
  CHECK(c.optimizer.type == OptimizerType::kSgd);
  CHECK(c.optimizer.lr == 0.05);
  CHECK(c.optimizer.momentum == 0.9);
  CHECK(c.train.epochs == 10);
  CHECK(c.train.checkpoint.keep_last == 3);
  CHECK(c.distributed.backend == Backend::kInproc);
  CHECK(c.runtime.threads == 0);
  CHECK(c.source_path.empty());
}

TEST_CASE("every key is read into its field") {
  const Config c = parse_config(kEveryKey, "x.yaml");
  CHECK(c.seed == 7);
  CHECK(c.model.complexity == Complexity::kNone);
  CHECK(c.model.hidden == std::vector<int64_t>{64, 32});
  CHECK(c.model.activation == Activation::kGelu);
  CHECK(c.model.dropout == 0.25);
  CHECK(c.model.layer_norm);
  CHECK(c.model.init == WeightInit::kXavier);
  CHECK(c.model.loss == Loss::kMse);
  CHECK(c.model.input_features == 20);
  CHECK(c.model.num_classes == 3);
  CHECK(c.data.format == DataFormat::kCsv);
  CHECK(c.data.train.path == std::vector<std::string>{"/d/train.csv"});
  CHECK(c.data.test.path == std::vector<std::string>{"/d/test.csv"});
  CHECK(c.data.batch_size == 64);
  CHECK(c.data.eval_batch_size == 500);
  CHECK_FALSE(c.data.shuffle);
  CHECK(c.data.drop_last);
  CHECK(c.data.normalize == Normalize::kScale);
  CHECK(c.data.csv.header == CsvHeader::kTrue);
  CHECK(c.data.csv.label_column == "label");
  CHECK(c.data.csv.delimiter == ';');
  CHECK(c.optimizer.type == OptimizerType::kAdamw);
  CHECK(c.optimizer.lr == 0.003);
  CHECK(c.optimizer.weight_decay == 0.01);
  CHECK(c.optimizer.beta1 == 0.8);
  CHECK(c.optimizer.beta2 == 0.99);
  CHECK(c.optimizer.eps == 1e-6);
  CHECK(c.optimizer.scale_lr == ScaleLr::kLinear);
  CHECK(c.optimizer.clip_grad_norm == 1.5);
  CHECK(c.optimizer.schedule.type == ScheduleType::kCosine);
  CHECK(c.optimizer.schedule.warmup_steps == 100);
  CHECK(c.optimizer.schedule.min_lr == 0.0001);
  CHECK(c.train.epochs == 3);
  CHECK(c.train.max_steps == 1000);
  CHECK(c.train.log_every == 10);
  CHECK(c.train.eval_every == 200);
  CHECK(c.train.grad_accum_steps == 2);
  CHECK(c.train.checkpoint.every_steps == 500);
  CHECK(c.train.checkpoint.keep_last == 2);
  CHECK(c.distributed.backend == Backend::kGrpc);
  CHECK(c.distributed.world_size == 4);
  CHECK(c.distributed.strategy == StrategyKind::kDdp);
  CHECK(c.runtime.threads == 2);

  // The keys of SGD and of the step schedule (kEveryKey has adamw and cosine).
  const Config o = parse_config(
      "data: {format: synthetic}\n"
      "optimizer: {type: sgd, momentum: 0.5, nesterov: true,\n"
      "            schedule: {type: step, step_size: 50, gamma: 0.5}}\n",
      "x.yaml");
  CHECK(o.optimizer.momentum == 0.5);
  CHECK(o.optimizer.nesterov);
  CHECK(o.optimizer.schedule.step_size == 50);
  CHECK(o.optimizer.schedule.gamma == 0.5);

  const Config s = parse_config(
      "data: {format: synthetic, test_fraction: 0.1,\n"
      "       synthetic: {samples: 100, features: 8, classes: 3, noise: 0.1, seed: 5}}\n",
      "x.yaml");
  CHECK(s.data.test_fraction == 0.1);
  CHECK(s.data.synthetic.samples == 100);
  CHECK(s.data.synthetic.features == 8);
  CHECK(s.data.synthetic.classes == 3);
  CHECK(s.data.synthetic.noise == 0.1);
  CHECK(s.data.synthetic.seed == 5);
}

TEST_CASE("omitted keys keep the struct defaults") {
  const Config c = parse_config(kSynthetic, "x.yaml");
  Config expected;
  expected.data.format = DataFormat::kSynthetic;
  CHECK(config_to_json(c) == config_to_json(expected));
  CHECK(c.seed == 42);
  CHECK(c.model.hidden == std::vector<int64_t>{512, 512});
  CHECK(c.data.test_fraction == -1.0);
  CHECK(c.optimizer.lr == 0.01);
  CHECK(c.train.epochs == 10);
  CHECK(c.distributed.world_size == 1);

  // Empty sections (null or {}) are all defaults too.
  const Config e = parse_config("model:\noptimizer: {}\ndata: {format: synthetic}\n", "x.yaml");
  CHECK(config_to_json(e) == config_to_json(expected));
}

TEST_CASE("scalar typing: quoted strings, bools, numbers") {
  // String fields take any scalar; a quoted delimiter can be a tab.
  const Config c = parse_config(
      "data: {format: csv, train: {path: 1}, csv: {label_column: 0, delimiter: \"\\t\"}}\n"
      "optimizer: {lr: +1e-2, momentum: .5}\nseed: +3\n",
      "x.yaml");
  CHECK(c.data.train.path == std::vector<std::string>{"1"});
  CHECK(c.data.csv.label_column == "0");
  CHECK(c.data.csv.delimiter == '\t');
  CHECK(c.optimizer.lr == 0.01);
  CHECK(c.optimizer.momentum == 0.5);
  CHECK(c.seed == 3);
  CHECK(parse_config("data: {format: synthetic, shuffle: False}", "x").data.shuffle == false);
  CHECK(parse_config("data: {format: synthetic, drop_last: TRUE}", "x").data.drop_last);
  CHECK(parse_config("model: {hidden: []}\n" + std::string(kSynthetic), "x").model.hidden.empty());
}

TEST_CASE("explicit YAML tags: only the key's own type, NUL bytes in strings are refused") {
  // The tag of the type the key reads is redundant and accepted.
  const Config c = parse_config(
      "data: {format: !!str synthetic, batch_size: !!int 8, shuffle: !!bool false}\n"
      "optimizer: {lr: !!float 0.5, momentum: !!int 0}\n",
      "x.yaml");
  CHECK(c.data.batch_size == 8);
  CHECK_FALSE(c.data.shuffle);
  CHECK(c.optimizer.lr == 0.5);
  // Another type's tag, or a custom one, was read as if absent ("values are typed strictly"); a
  // NUL byte ("\0" in a double-quoted YAML string) cut a path short at every system call:
  // "ok.csv\0zzz" read ok.csv.
  const std::pair<std::string, std::string> refused[] = {
      {"data: {format: synthetic, batch_size: !!str 8}",
       "1:39: data.batch_size: expected an integer, got '8' tagged !!str (remove the tag)"},
      {"seed: !!float 7",
       "1:7: seed: expected an integer, got '7' tagged !!float (remove the tag)"},
      {"data: {format: synthetic, shuffle: !!str true}",
       "1:36: data.shuffle: expected true or false, got 'true' tagged !!str (remove the tag)"},
      {"data: {format: !mine synthetic}",
       "1:16: data.format: expected a string, got 'synthetic' tagged !mine (remove the tag)"},
      {"data: {format: csv, train: {path: \"ok.csv\\0zzz\"}}",
       "1:35: data.train.path: expected a path, got a string with a NUL byte"},
      {"data: {format: csv, train: {path: [a.csv, \"b\\0\"]}}",
       "1:43: data.train.path[1]: expected a path, got a string with a NUL byte"},
  };
  for (const auto& [yaml, want] : refused) CHECK(error_of(yaml + "\n") == "x.yaml:" + want);
}

TEST_CASE("YAML syntax errors carry FILE:LINE:COL and yaml-cpp's message") {
  const std::string flow = error_of("seed: 1\nmodel: {type: mlp\nseed: 2\n");
  CHECK(flow.starts_with("x.yaml:"));
  CHECK(flow.find("end of map flow not found") != std::string::npos);
  CHECK(error_of("model:\n\ttype: mlp\n").starts_with("x.yaml:2:"));
  CHECK(error_of("seed: 1\n  bad: indent\n") == "x.yaml:2:6: illegal map value");
  CHECK(error_of("seed: 1\n---\nseed: 2\n") ==
        "x.yaml:3:1: expected one YAML document, found another after the first's end (a '---' "
        "or '...' line)");
  // '...' ends a document too: the message named a '---' the file did not have.
  CHECK(error_of("seed: 1\n...\nseed: 2\n") == error_of("seed: 1\n---\nseed: 2\n"));
  CHECK(error_of("---\ndata: {format: synthetic}\n---\n") == "(no error)");
}

TEST_CASE("the top level must be a mapping, an empty file fails on the first required key") {
  CHECK(error_of("- 1\n- 2\n") ==
        "x.yaml:1:1: a config must be a mapping of sections (seed, model, data, optimizer, "
        "train, distributed, runtime), got a sequence");
  CHECK(error_of("hello\n").ends_with("got 'hello'"));
  CHECK(error_of("") == "x.yaml: data.train.images: required for format idx");
  CHECK(error_of("# only a comment\n") == "x.yaml: data.train.images: required for format idx");
  CHECK(error_of("data: {format: idx}\n") ==
        "x.yaml:1:7: data.train.images: required for format idx");
}

TEST_CASE("unknown, duplicate and malformed keys") {
  CHECK(error_of("seed: 1\ndata: {format: synthetic}\nmodel:\n  hiden: [1]\n") ==
        "x.yaml:4:3: unknown key 'model.hiden' (did you mean 'hidden'?)");
  CHECK(error_of("model: {colour: red}\n") == "x.yaml:1:9: unknown key 'model.colour'");
  CHECK(error_of("lr: 0.1\n") == "x.yaml:1:1: unknown key 'lr' (did you mean 'optimizer.lr'?)");
  CHECK(error_of("optimizer:\n  wieght_decay: 0\n") ==
        "x.yaml:2:3: unknown key 'optimizer.wieght_decay' (did you mean 'weight_decay'?)");
  CHECK(error_of("optimizer: {schedule: {warmup: 10}}\n") ==
        "x.yaml:1:24: unknown key 'optimizer.schedule.warmup' (did you mean 'warmup_steps'?)");
  CHECK(error_of("Seed: 1\n") == "x.yaml:1:1: unknown key 'Seed' (did you mean 'seed'?)");
  // Other trainers' names, too far from dtrain's for the spelling match (no suggestion before).
  CHECK(error_of("optimizer: {learning_rate: 0.1}\n") ==
        "x.yaml:1:13: unknown key 'optimizer.learning_rate' (did you mean 'optimizer.lr'?)");
  CHECK(error_of("train: {num_epochs: 3}\n") ==
        "x.yaml:1:9: unknown key 'train.num_epochs' (did you mean 'train.epochs'?)");
  CHECK(error_of("random_seed: 3\n") ==
        "x.yaml:1:1: unknown key 'random_seed' (did you mean 'seed'?)");
  CHECK(error_of("seed: 1\nseed: 2\n") == "x.yaml:2:1: duplicate key 'seed'");
  CHECK(error_of("model: {[a]: 1}\n") ==
        "x.yaml:1:9: keys must be plain names, got a sequence in section 'model'");
  // --set's dotted spelling in a file, and YAML merge keys: said what they are.
  CHECK(error_of("optimizer.lr: 0.1\n") ==
        "x.yaml:1:1: unknown key 'optimizer.lr' ('optimizer.lr' is --set's spelling: in YAML "
        "nest it, as optimizer: {...})");
  CHECK(error_of("data:\n  synthetic.samples: 10\n") ==
        "x.yaml:2:3: unknown key 'data.synthetic.samples' ('data.synthetic.samples' is --set's "
        "spelling: in YAML nest it, as synthetic: {...})");
  // A leading dot is no --set path (--set refuses it): not called one.
  CHECK(error_of(".seed: 1\n").find("--set's spelling") == std::string::npos);
  // Non-scalar names in a layer list are named as what they are (they showed as '').
  CHECK(error_of("model: {type: sequential, layers: [flatten, {[a]: 1}]}\n")
            .find("expected a layer: a name such as relu") != std::string::npos);
  CHECK(error_of("model: {type: sequential, layers: [{conv2d: {[a]: 1}}]}\n")
            .find("model.layers[0].conv2d: field names must be plain names, got") !=
        std::string::npos);
  CHECK(error_of("optimizer: {<<: {lr: 0.1}}\n").find("YAML merge keys '<<' are not supported") !=
        std::string::npos);
}

TEST_CASE("wrong types name the key and what was found") {
  CHECK(error_of("data:\n  format: synthetic\n  batch_size: abc\n") ==
        "x.yaml:3:15: data.batch_size: expected an integer, got 'abc'");
  CHECK(error_of("data: {format: synthetic, batch_size: 1.5}\n") ==
        "x.yaml:1:39: data.batch_size: expected an integer, got '1.5'");
  CHECK(error_of("data: {format: synthetic, batch_size: \"128\"}\n") ==
        "x.yaml:1:39: data.batch_size: expected an integer, got the quoted string '128'");
  CHECK(error_of("seed: 99999999999999999999\n") ==
        "x.yaml:1:7: seed: integer out of range (got '99999999999999999999')");
  CHECK(error_of("optimizer: {lr: fast}\n") ==
        "x.yaml:1:17: optimizer.lr: expected a number, got 'fast'");
  CHECK(error_of("optimizer: {lr: .inf}\n") ==
        "x.yaml:1:17: optimizer.lr: expected a number, got '.inf'");
  CHECK(error_of("optimizer: {lr: nan}\n") ==
        "x.yaml:1:17: optimizer.lr: expected a finite number, got 'nan'");
  CHECK(error_of("optimizer: {lr: 1e999}\n") ==
        "x.yaml:1:17: optimizer.lr: number out of range (got '1e999')");
  // A null value is located at its key (yaml-cpp marks it at the next token).
  CHECK(error_of("optimizer:\n  lr:\n") ==
        "x.yaml:2:3: optimizer.lr: expected a number, got null (no value)");
  CHECK(error_of("data: {format: synthetic, shuffle: yes}\n") ==
        "x.yaml:1:36: data.shuffle: expected true or false, got 'yes'");
  CHECK(error_of("data: {format: synthetic, shuffle: 1}\n") ==
        "x.yaml:1:36: data.shuffle: expected true or false, got '1'");
  CHECK(error_of("model: {activation: {a: 1}}\n") ==
        "x.yaml:1:21: model.activation: expected a string, got a mapping");
  CHECK(error_of("model: {init: }\n") ==
        "x.yaml:1:9: model.init: expected a string, got null (no value)");
  CHECK(error_of("model: {hidden: }\n") ==
        "x.yaml:1:9: model.hidden: expected a sequence of integers such as [512, 512], got null "
        "(no value)");
  CHECK(error_of("model: {hidden: 512}\n") ==
        "x.yaml:1:17: model.hidden: expected a sequence of integers such as [512, 512], got '512'");
  CHECK(error_of("model: {hidden: [64, 1.5]}\n") ==
        "x.yaml:1:22: model.hidden[1]: expected an integer, got '1.5'");
  CHECK(error_of("model: mlp\n") ==
        "x.yaml:1:8: model: expected a mapping of keys (type, layers, n_layer, n_head, n_embd, "
        "block_size, tie_embeddings, complexity, hidden, activation, dropout, layer_norm, init, "
        "loss, input_features, num_classes), got 'mlp'");
  CHECK(error_of("data: [1, 2]\n").starts_with("x.yaml:1:7: data: expected a mapping of keys ("));
  CHECK(error_of("data: {format: csv, train: {path: x}, csv: {delimiter: ';;'}}\n") ==
        "x.yaml:1:56: data.csv.delimiter: must be exactly one character (got ';;'; quote it, "
        "e.g. \"\\t\")");
}

TEST_CASE("data keys must fit data.format") {
  CHECK(error_of("data:\n  format: idx\n  train: {images: a, labels: b, path: c}\n") ==
        "x.yaml:3:39: data.train.path: not used by format idx (it reads images and labels)");
  CHECK(error_of("data: {format: idx, train: {images: a}}\n") ==
        "x.yaml:1:28: data.train.labels: required for format idx");
  CHECK(error_of("data: {format: idx, train: {images: a, labels: b}, test: {images: c}}\n") ==
        "x.yaml:1:58: data.test.labels: required when data.test.images is given (give both or "
        "neither)");
  CHECK(error_of("data: {format: idx, train: {images: a, labels: b}, test: {labels: c}}\n") ==
        "x.yaml:1:58: data.test.images: required when data.test.labels is given (give both or "
        "neither)");
  CHECK(error_of("data: {format: csv}\n") ==
        "x.yaml:1:7: data.train.path: required for format csv");
  CHECK(error_of("data: {format: csv, train: {path: a, images: b}}\n") ==
        "x.yaml:1:46: data.train.images: not used by format csv (it reads path)");
  CHECK(error_of("data: {format: csv, train: {path: a}, test: {labels: b}}\n") ==
        "x.yaml:1:54: data.test.labels: not used by format csv (it reads path)");
  CHECK(error_of("data: {format: synthetic, test: {path: a}}\n") ==
        "x.yaml:1:40: data.test.path: not used by format synthetic (it generates its data from "
        "no files)");
  CHECK(set_error("data.csv.delimiter=;") ==
        "--set data.csv.delimiter=;: data.csv.delimiter: only used by format csv (format is "
        "synthetic)");
  CHECK(set_error("data.synthetic.samples=100", kCsv) ==
        "--set data.synthetic.samples=100: data.synthetic.samples: only used by format synthetic "
        "(format is csv)");
  CHECK(set_error("data.csv.header=yes", kCsv) ==
        "--set data.csv.header=yes: data.csv.header: must be one of auto, true, false (got "
        "'yes')");
  CHECK(set_error("data.csv.delimiter='\"'", kCsv) ==
        "--set data.csv.delimiter='\"': data.csv.delimiter: cannot be a newline or a double "
        "quote");
  CHECK(set_error("data.test_fraction=0.2",
                  "data: {format: csv, train: {path: a}, test: {path: "
                  "b}}\n") ==
        "--set data.test_fraction=0.2: data.test_fraction: contradicts data.test: a test set is "
        "given, so nothing is held out (remove one)");
  // Options of another format at their defaults are harmless (config_to_json writes them all).
  CHECK(error_of("data: {format: synthetic, csv: {header: auto, delimiter: ','}, train: "
                 "{path: ''}}\n") == "(no error)");
  // Switching format from the command line: clear the other format's files with an empty
  // section ({}; a null one is refused, as an unset shell variable gives it).
  CHECK(error_of(kCsv, {"data.format=synthetic"}) ==
        "x.yaml:1:35: data.train.path: not used by format synthetic (it generates its data from "
        "no files)");
  CHECK(error_of(kCsv, {"data.format=synthetic", "data.train={}"}) == "(no error)");
}

TEST_CASE("complexity presets set hidden, giving both is a contradiction") {
  const std::string data = kSynthetic;
  CHECK(parse_config("model: {complexity: simple}\n" + data, "x").model.hidden ==
        std::vector<int64_t>{128});
  CHECK(parse_config("model: {complexity: medium}\n" + data, "x").model.hidden ==
        std::vector<int64_t>{512, 512});
  const Config c = parse_config("model: {complexity: complex}\n" + data, "x");
  CHECK(c.model.complexity == Complexity::kComplex);
  CHECK(c.model.hidden == std::vector<int64_t>{1024, 1024, 512, 256});
  CHECK(parse_config("model: {complexity: '', hidden: [3]}\n" + data, "x").model.hidden ==
        std::vector<int64_t>{3});

  CHECK(error_of("model: {complexity: simple, hidden: [64]}\n" + data) ==
        "x.yaml:1:37: model.hidden: contradicts model.complexity 'simple' (the preset sets "
        "hidden); give only one of them");
  CHECK(error_of("model: {hidden: [64]}\n" + data, {"model.complexity=simple"}) ==
        "x.yaml:1:17: model.hidden: contradicts model.complexity 'simple' (the preset sets "
        "hidden); give only one of them");
  CHECK(error_of("model: {complexity: simple}\n" + data, {"model.hidden=[8]"}) ==
        "--set model.hidden=[8]: model.hidden: contradicts model.complexity 'simple' (the preset "
        "sets hidden); give only one of them");

  // A preset is the same math as its widths: same JSON, same hash.
  const Config explicit_widths = parse_config("model: {hidden: [512, 512]}\n" + data, "x");
  const Config preset = parse_config("model: {complexity: medium}\n" + data, "x");
  CHECK(config_to_json(preset) == config_to_json(explicit_widths));
  CHECK(config_hash(preset) == config_hash(explicit_widths));
}

TEST_CASE("--set overrides replace values before validation") {
  const std::string base =
      "model: {activation: tanh, hidden: [4]}\noptimizer: {lr: 0.5}\n" + std::string(kSynthetic);
  SUBCASE("scalar, list, bool") {
    const Config c = parse_config(
        base, "x", {"optimizer.lr=0.1", "model.hidden=[256,256]", "data.shuffle=false"});
    CHECK(c.optimizer.lr == 0.1);
    CHECK(c.model.hidden == std::vector<int64_t>{256, 256});
    CHECK(c.model.activation == Activation::kTanh);  // siblings untouched
    CHECK_FALSE(c.data.shuffle);
    CHECK(parse_config(base, "x", {"model.hidden=[]"}).model.hidden.empty());
  }
  SUBCASE("new nested keys create their sections, and siblings added later persist") {
    const Config c = parse_config(base, "x",
                                  {"optimizer.schedule.type=step", "optimizer.schedule.gamma=0.5",
                                   "train.checkpoint.keep_last=7"});
    CHECK(c.optimizer.schedule.type == ScheduleType::kStep);
    CHECK(c.optimizer.schedule.gamma == 0.5);
    CHECK(c.optimizer.lr == 0.5);
    CHECK(c.train.checkpoint.keep_last == 7);
    const Config e = parse_config("", "x", {"data.format=synthetic", "optimizer.lr=0.2"});
    CHECK(e.data.format == DataFormat::kSynthetic);
    CHECK(e.optimizer.lr == 0.2);
    CHECK(parse_config("optimizer:\n" + std::string(kSynthetic), "x", {"optimizer.lr=0.3"})
              .optimizer.lr == 0.3);
  }
  SUBCASE("a whole section is replaced, the later override wins, spaces around the key") {
    const Config c =
        parse_config(base, "x", {"model={hidden: [8]}", "optimizer.lr=0.1", " optimizer.lr = 0.2"});
    CHECK(c.model.hidden == std::vector<int64_t>{8});
    CHECK(c.model.activation == Activation::kRelu);
    CHECK(c.optimizer.lr == 0.2);
  }
  SUBCASE("the parsed file is not left with a duplicate key") {
    // Replacing in place: a second `lr` would be a duplicate-key error in the walk.
    CHECK(error_of("optimizer: {lr: 0.5, momentum: 0.9}\n" + std::string(kSynthetic),
                   {"optimizer.lr=0.1", "optimizer.momentum=0.5"}) == "(no error)");
  }
  SUBCASE("unknown keys are located at the override") {
    CHECK(set_error("model.hiden=[1]") ==
          "--set model.hiden=[1]: unknown key 'model.hiden' (did you mean 'hidden'?)");
    CHECK(set_error("lr=0.1") == "--set lr=0.1: unknown key 'lr' (did you mean 'optimizer.lr'?)");
    CHECK(set_error("model={hiden: [1]}") ==
          "--set model={hiden: [1]}: unknown key 'model.hiden' (did you mean 'hidden'?)");
    CHECK(set_error("seed.x=1") == "--set seed.x=1: 'seed' is a value, not a section with key 'x'");
    CHECK(set_error("data.batch_size=abc") ==
          "--set data.batch_size=abc: data.batch_size: expected an integer, got 'abc'");
    CHECK(set_error("optimizer.lr=") ==
          "--set optimizer.lr=: optimizer.lr: expected a number, got null (no value)");
    CHECK(set_error("model=mlp").starts_with("--set model=mlp: model: expected a mapping of keys"));
  }
  SUBCASE("malformed overrides") {
    CHECK(set_error("optimizer.lr") == "--set optimizer.lr: expected key.path=value");
    CHECK(set_error("=1") == "--set =1: empty key path (expected key.path=value)");
    CHECK(set_error("model..hidden=1") ==
          "--set model..hidden=1: malformed key path 'model..hidden'");
    CHECK(set_error("model.=1") == "--set model.=1: malformed key path 'model.'");
    const std::string bad = set_error("model.hidden=[1,");
    CHECK(bad.starts_with("--set model.hidden=[1,: the value is not valid YAML: "));
    CHECK(bad.size() > std::string("--set model.hidden=[1,: the value is not valid YAML: ").size());
  }
  SUBCASE("an override reaches only its key, not others that alias the same YAML node") {
    // lr and momentum share one node (&x / *x): overriding lr leaves momentum as written.
    const std::string v =
        "optimizer: {type: sgd, lr: &x 0.5, momentum: *x}\n" + std::string(kSynthetic);
    Config c = parse_config(v, "x", {"optimizer.lr=0.01"});
    CHECK(c.optimizer.lr == 0.01);
    CHECK(c.optimizer.momentum == 0.5);
    // A whole section aliased (test: *tr): the override goes into data.test only -- training
    // on the test file would follow otherwise.
    c = parse_config("data: {format: csv, train: &tr {path: /a.csv}, test: *tr}\n", "x",
                     {"data.test.path=/b.csv"});
    CHECK(c.data.test.path == std::vector<std::string>{"/b.csv"});
    CHECK(c.data.train.path == std::vector<std::string>{"/a.csv"});
    // Aliased sections (as data.train and data.test could be) stay apart.
    c = parse_config("data: {format: synthetic, batch_size: &n 8}\ntrain: {max_steps: *n}\n", "x",
                     {"data.batch_size=4"});
    CHECK(c.data.batch_size == 4);
    CHECK(c.train.max_steps == 8);
  }
  SUBCASE("a NUL byte is named where it is (yaml-cpp blamed the character after it)") {
    const std::string nul = std::string("model: {hidden: [4], activation: re") + '\0' + "lu}\n";
    CHECK(error_of(nul, {}) == "x.yaml:1:36: a NUL byte: a config is text, and this file is not");
  }
  SUBCASE("aliases nested in aliases (a billion laughs) are refused at once") {
    std::string bomb = "model:\n  hidden: [&a0 [1,1,1,1,1,1,1,1,1,1]";
    for (int i = 1; i < 12; ++i) {
      bomb += ", &a" + std::to_string(i) + " [";
      for (int k = 0; k < 10; ++k) bomb += (k ? ",*a" : "*a") + std::to_string(i - 1);
      bomb += "]";
    }
    bomb += "]\n";
    CHECK(error_of(bomb, {}).find("expands to more than 100000 values") != std::string::npos);
    // The same in a --set value (was: unbounded, minutes per level), and an alias inside the
    // node it names, in the file or in --set (was: a stack overflow, exit 139).
    std::string value = bomb.substr(bomb.find('['));
    value.pop_back();  // the newline
    CHECK(error_of(kSynthetic, {"model.hidden=" + value})
              .starts_with("--set model.hidden=[&a0 [1,1,1,1,1,1,1,1,1,1], &a1"));
    CHECK(error_of(kSynthetic, {"model.hidden=" + value}).find("expands to more than 100000") !=
          std::string::npos);
    CHECK(error_of("model: &a {hidden: *a}\n", {}).find("an alias inside the node it names") !=
          std::string::npos);
    CHECK(error_of(kSynthetic, {"model.hidden=&a [*a]"})
              .find("holds an alias inside the node it names") != std::string::npos);
    // Plain nesting past the limit, no alias in sight: named as such, where it is (was the
    // alias message at the document's start).
    std::string deep = "seed: ";
    for (int i = 0; i < 250; ++i) deep += "[";
    for (int i = 0; i < 250; ++i) deep += "]";
    CHECK(error_of(deep + "\n", {}) ==
          "x.yaml:1:207: collections nested more than 200 levels deep (a dtrain config nests 5 "
          "at most)");
  }
  SUBCASE("an override below a file value that is not a mapping reports the file") {
    CHECK(error_of("model: mlp\n", {"model.hidden=[1]"})
              .starts_with("x.yaml:1:8: model: expected a mapping of keys"));
    CHECK(error_of(kSynthetic, {"model=3", "model.hidden=[1]"})
              .starts_with("--set model=3: model: expected a mapping of keys"));
    CHECK(error_of("- 1\n", {"seed=1"}).starts_with("x.yaml:1:1: a config must be a mapping"));
  }
}

TEST_CASE("relative data paths resolve against the config file's folder, --set ones against cwd") {
  TempDir tmp;
  const fs::path cfg = tmp.write("sub/c.yaml",
                                 "data:\n"
                                 "  format: idx\n"
                                 "  train: {images: imgs/train.gz, labels: ../labels.gz}\n"
                                 "  test: {images: /abs/t.gz, labels: t-labels.gz}\n");
  const Config c = load_config(cfg.string(), {"data.test.labels=rel/x.gz"});
  CHECK(c.source_path == cfg.string());
  CHECK(c.data.train.images == (tmp.path() / "sub/imgs/train.gz").string());
  CHECK(c.data.train.labels == (tmp.path() / "labels.gz").string());
  CHECK(c.data.test.images == "/abs/t.gz");
  CHECK(c.data.test.labels == (fs::current_path() / "rel/x.gz").string());
  // Absolute ones lexically normal: ranks given "/abs//t.gz" and "/abs/t.gz" were refused at the
  // rendezvous for configs that differ.
  CHECK(load_config(cfg.string(), {"data.test.images=/abs//./t.gz"}).data.test.images ==
        "/abs/t.gz");
  CHECK_FALSE(config_to_json(c).contains("source_path"));
  // A config in the working directory, named without a folder: absolute paths too, so the
  // config.json a run writes into its own folder loads back from there.
  const fs::path here = fs::current_path();
  fs::current_path(tmp.path() / "sub");
  const Config w = load_config("c.yaml");
  fs::current_path(here);
  CHECK(w.data.train.images == (tmp.path() / "sub/imgs/train.gz").string());

  // parse_config: relative to the working directory, i.e. as written.
  const Config p = parse_config("data: {format: csv, train: {path: d/train.csv}}\n", "x");
  CHECK(p.data.train.path == std::vector<std::string>{"d/train.csv"});

  // File errors are located in that file.
  const fs::path bad = tmp.write("bad.yaml", "data: {format: synthetic}\noptimizer: {lr: -1}\n");
  try {
    load_config(bad.string());
    FAIL("no error");
  } catch (const UserError& e) {
    CHECK(std::string(e.what()) == bad.string() + ":2:17: optimizer.lr: must be > 0 (got -1)");
  }
  CHECK_THROWS_AS(load_config((tmp.path() / "missing.yaml").string()), UserError);
}

TEST_CASE("config_to_json writes every field and loads back to the same config") {
  for (const char* text : {kEveryKey, kFmnist, kSynthetic}) {
    const nlohmann::json j = config_to_json(parse_config(text, "x"));
    CHECK(j.size() == 7);
    CHECK(j["model"].size() == 10);
    CHECK(j["data"].size() == 11);
    CHECK(j["data"]["csv"].size() == 3);
    CHECK(j["data"]["synthetic"].size() == 5);
    CHECK(j["optimizer"].size() == 11);
    CHECK(j["optimizer"]["schedule"].size() == 5);
    CHECK(j["train"].size() == 7);
    CHECK(j["train"]["checkpoint"].size() == 2);
    CHECK(j["distributed"].size() == 15);
    CHECK(j["distributed"]["compression"].size() == 4);
    CHECK(j["runtime"].size() == 1);
    // JSON is YAML: the dump parses back to an identical config.
    CHECK(config_to_json(parse_config(j.dump(), "json")) == j);
  }
  const nlohmann::json j = config_to_json(parse_config(kEveryKey, "x"));
  CHECK(j["data"]["csv"]["delimiter"] == ";");
  CHECK(j["optimizer"]["schedule"]["min_lr"] == 0.0001);
  CHECK(j["train"]["checkpoint"]["keep_last"] == 2);
}

TEST_CASE("config_hash ignores cadence fields and tracks the math") {
  const std::string h = config_hash(parse_config(kFmnist, "x"));
  CHECK(h.size() == 16);
  CHECK(h == config_hash(parse_config(kFmnist, "other-name")));
  for (const char* same :
       {"train.epochs=3", "train.max_steps=50", "train.log_every=1", "train.eval_every=10",
        "train.checkpoint={every_steps: 5, keep_last: 9}", "runtime.threads=4"}) {
    CAPTURE(same);
    CHECK(config_hash(parse_config(kFmnist, "x", {same})) == h);
  }
  for (const char* differs :
       {"optimizer.lr=0.1", "seed=1", "model.hidden=[256]", "distributed.world_size=2",
        "data.batch_size=64", "train.grad_accum_steps=2"}) {
    CAPTURE(differs);
    CHECK(config_hash(parse_config(kFmnist, "x", {differs})) != h);
  }
  // -0.0 is 0: the same setting (it passed the >= 0 checks and changed the hash).
  for (const char* key : {"optimizer.weight_decay", "optimizer.momentum", "data.test_fraction"}) {
    CAPTURE(key);
    CHECK(config_hash(parse_config(kFmnist, "x", {std::string(key) + "=-0.0"})) ==
          config_hash(parse_config(kFmnist, "x", {std::string(key) + "=0"})));
  }
  CHECK_FALSE(std::signbit(
      parse_config(kFmnist, "x", {"optimizer.weight_decay=-0.0"}).optimizer.weight_decay));
}

TEST_CASE("the shipped configs/*.yaml are valid") {
  const fs::path dir = fs::path(DTRAIN_SOURCE_DIR) / "configs";
  int n = 0;
  for (const auto& entry : fs::directory_iterator(dir)) {
    if (entry.path().extension() != ".yaml") continue;
    CAPTURE(entry.path().string());
    CHECK_NOTHROW(load_config(entry.path().string()));
    ++n;
  }
  CHECK(n > 0);
}

TEST_CASE("distributed keys: timeouts, tls all-or-none, per-host keys outside the hash") {
  const std::string base = "data: {format: synthetic}\n";
  const Config c = parse_config(
      base, "d.yaml",
      {"distributed.timeout_s=5", "distributed.bind=0.0.0.0", "distributed.backend=grpc"});
  CHECK(c.distributed.timeout_s == 5.0);
  CHECK(c.distributed.bind == "0.0.0.0");
  CHECK(c.distributed.rendezvous_timeout_s == 120.0);
  CHECK(c.distributed.heartbeat_s == 10.0);
  CHECK_THROWS_WITH_AS(parse_config(base, "d.yaml", {"distributed.timeout_s=0"}),
                       doctest::Contains("distributed.timeout_s"), UserError);
  // Tiny but positive deadlines were accepted, then every receive timed out "after 0 s".
  CHECK_THROWS_WITH_AS(parse_config(base, "d.yaml", {"distributed.timeout_s=1e-6"}),
                       doctest::Contains("distributed.timeout_s: must be >= 0.1"), UserError);
  CHECK_THROWS_WITH_AS(parse_config(base, "d.yaml", {"distributed.rendezvous_timeout_s=0.5"}),
                       doctest::Contains("rendezvous_timeout_s: must be >= 1"), UserError);
  CHECK_THROWS_WITH_AS(parse_config(base, "d.yaml", {"distributed.heartbeat_s=0"}),
                       doctest::Contains("distributed.heartbeat_s"), UserError);
  CHECK_THROWS_WITH_AS(parse_config(base, "d.yaml", {"distributed.heartbeat_s=-1"}),
                       doctest::Contains("distributed.heartbeat_s"), UserError);
  // A silence shorter than a busy host's scheduling blamed healthy ranks as frozen.
  CHECK_THROWS_WITH_AS(parse_config(base, "d.yaml", {"distributed.heartbeat_s=0.001"}),
                       doctest::Contains("distributed.heartbeat_s"), UserError);
  CHECK(parse_config(base, "d.yaml", {"distributed.heartbeat_s=0.1"}).distributed.heartbeat_s ==
        0.1);
  CHECK_THROWS_WITH_AS(parse_config(base, "d.yaml", {"distributed.tls.cert=a.pem"}),
                       doctest::Contains("needs all of cert, key and ca"), UserError);
  CHECK_THROWS_WITH_AS(parse_config(base, "d.yaml", {"distributed.tsl.cert=a.pem"}),
                       doctest::Contains("did you mean 'tls'"), UserError);
  const Config d = parse_config(
      base, "d.yaml",
      {"distributed.bind=10.0.0.2", "distributed.timeout_s=7", "distributed.backend=grpc",
       "distributed.shm=false", "distributed.tcp=false", "distributed.heartbeat_s=2.5"});
  CHECK(d.distributed.heartbeat_s == 2.5);
  CHECK(c.distributed.shm);
  CHECK(!d.distributed.shm);
  CHECK(c.distributed.tcp);
  CHECK(!d.distributed.tcp);
  CHECK(config_hash(c) == config_hash(d));
  CHECK(config_hash(c) != config_hash(parse_config(base, "d.yaml")));  // backend differs
}

}  // namespace dtrain
