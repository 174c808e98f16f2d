// `dtrain eval` and `dtrain predict`: a trained model on the test set or on rows of a CSV file.
#include "dtrain/eval_cmd.h"

#include <unistd.h>

#include <cmath>
#include <filesystem>
#include <iostream>
#include <regex>
#include <sstream>

#include <fmt/ranges.h>
#include <spdlog/spdlog.h>
#include <nlohmann/json.hpp>

#include "checkpoint/checkpoint.h"
#include "data/dataset.h"
#include "data/text.h"
#include "dtrain/cli.h"
#include "nn/loss.h"
#include "nn/model.h"
#include "nn/registry.h"
#include "tensor/blas.h"
#include "train/checkpoint_config.h"
#include "train/tied_grads.h"
#include "train/trainer.h"
#include "util/check.h"
#include "util/fs.h"
#include "util/strings.h"

namespace dtrain {
namespace {

// How predict's messages name --input -.
constexpr const char* kStdinName = "<stdin>";

// Model and weights for eval/predict: the config decides the architecture, the checkpoint the
// values; a mismatch is refused by load_checkpoint.
struct LoadedModel {
  Model model;
  std::vector<float> params;
  CheckpointMeta meta;
  std::string path;  // the resolved checkpoint
};

// The normaliser the checkpoint's training used (stored in it since 2026-12-05), else -- an
// older checkpoint -- the one fitted on the training data now. A stored one that differs from
// the data's now (the files changed since, another seed or test_fraction) wins, with a warning:
// the weights expect inputs scaled as in training.
Normalizer training_normalizer(const LoadedModel& m, const DataSplits& data) {
  if (m.meta.normalizer_json.empty() || data.train.kind != SampleKind::kFeatures)
    return data.normalizer;
  Normalizer n = Normalizer::from_json(m.meta.normalizer_json, data.train.features,
                                       "checkpoint '" + m.path + "'");
  if (!(n == data.normalizer))
    spdlog::warn(
        "the training data's statistics now differ from those checkpoint '{}' was trained with "
        "(the data files, data.normalize's inputs, the seed or test_fraction changed since): "
        "inputs are scaled with the checkpoint's",
        m.path);
  return n;
}

// The output width a sequential model's layer list gives samples of shape `sample`, whatever the
// data's classes (0: another model type, no list, or an output that is not flat).
int64_t layer_list_width(const Config& cfg, const Shape& sample) {
  if (cfg.model.type != ModelType::kSequential || cfg.model.layers.empty()) return 0;
  const Shape out = sequential_output_shape(cfg.model.layers, sample);
  return out.size() == 1 ? out[0] : 0;
}

// eval_rows: the rows to evaluate (-1: unknown), for the memory check before the parameters are
// allocated.
LoadedModel load_model(const Config& cfg, const DataSplits& data, const std::string& ckpt,
                       int64_t eval_rows) {
  const std::string path = resolve_checkpoint(ckpt, false);
  check_config_before_build(path, cfg);
  const ModelShape shape = resolve_model_shape(cfg, data);
  LoadedModel m{build_model(cfg.model, {shape.sample, shape.num_classes}), {}, {}, path};
  check_eval_memory(cfg, m.model, eval_rows);
  m.params.resize(static_cast<size_t>(m.model.param_count()));
  CheckpointMeta& meta = m.meta;
  try {
    meta = load_checkpoint(path, m.model, m.params.data(), {});
  } catch (const ModelMismatchError& e) {
    // The output width follows the training labels found (model.num_classes 0; test files of
    // their own take the checkpoint's, classes_from_checkpoint). (Text data has no labels: its
    // width is the vocabulary.)
    if (cfg.model.num_classes > 0 || shape.train_classes == 0) throw;
    // The training data's labels may have changed since (a class added): the shape error alone
    // blamed the checkpoint, with the config the run used.
    // (only where the output layer is what differs: [C, ...] or [C] the model expects)
    // (a file's words: "the model expects [C, H]"; a sharded one's: "the model has 'name' [C, H]")
    const std::regex expects("the model (expects|has '[^']*') \\[" +
                             std::to_string(shape.num_classes) + "[,\\]]");
    if (!std::regex_search(std::string(e.what()), expects)) throw;
    // (test files whose checkpoint's width classes_from_checkpoint could not read: a label only
    // they have widened the model)
    if (shape.num_classes > shape.train_classes)
      throw UserError(std::string(e.what()) + " -- the test data has label " +
                      std::to_string(shape.num_classes - 1) +
                      ", above the training data's labels (0.." +
                      std::to_string(shape.train_classes - 1) + "): check the test labels");
    throw UserError(std::string(e.what()) +
                    " -- with model.num_classes 0 the output width is the data's label count, "
                    "now " +
                    std::to_string(shape.num_classes) + " (labels 0.." +
                    std::to_string(shape.num_classes - 1) +
                    "): if the labels changed since training, set model.num_classes to the "
                    "checkpoint's output width");
  }
  check_tied_copies(m.model, m.params.data(), {}, path);
  spdlog::info("loaded {} (step {})", path, meta.step);
  return m;
}

// Whether eval and predict read only the test files (data.test) for the data's layout: the
// training files are not here (idx and csv; text reads its test file alone anyway), and the
// checkpoint's stored normaliser scales the inputs (stored_normalizer).
bool test_files_only(const DataConfig& d) {
  return !d.test.empty() && (d.format == DataFormat::kIdx || d.format == DataFormat::kCsv) &&
         !training_files_present(d);
}

// The normaliser the checkpoint stores, for inputs whose training files are not here; an older
// checkpoint without one cannot scale them (UserError naming the missing file).
Normalizer stored_normalizer(const LoadedModel& m, const Config& cfg, int64_t features) {
  if (m.meta.normalizer_json.empty())
    throw UserError("checkpoint '" + m.path +
                    "' stores no normaliser (written before 2026-12-05): its inputs are scaled "
                    "by the training data's statistics, and the training files (data.train) "
                    "are not here: " +
                    input_file_problem(cfg.data.format == DataFormat::kIdx
                                           ? cfg.data.train.images
                                           : cfg.data.train.path.at(0)));
  return Normalizer::from_json(m.meta.normalizer_json, features, "checkpoint '" + m.path + "'");
}

// eval and predict: the inputs' layout against the one the checkpoint recorded from its training
// data (data/dataset.h InputRecord). From test files alone (test_only), the test files' -- which
// the training files would have been checked against were they here: a test set of another image
// shape with as many pixels, or CSV columns in another order, was evaluated without a word; the
// training columns then stand for data.train's, which predict's --input header is held to (it
// was held to the test file's). Otherwise the training files' as they are now: another
// data.csv.label_column (or an edited file) made another column the label, same count of
// features, and the figures meaningless.
void check_input_layout(const std::string& ckpt, DataSplits& data, bool test_only) {
  const std::string path = resolve_checkpoint(ckpt, false);
  const std::string json = checkpoint_input_record(path);
  if (json.empty()) return;
  const InputRecord r = input_record_from_json(json, "checkpoint '" + path + "'");
  // A normaliser without the layout (2026-12-05 to 12-07): nothing to hold the test files to.
  if (test_only && !r.known)
    spdlog::warn(
        "checkpoint '{}' records no layout of its training inputs (written before 2026-12-07): "
        "data.test's sample shape and column order cannot be checked against the training "
        "data's, and a model reads its inputs by position: the test files must be laid out as "
        "the training files were",
        path);
  if (const std::string why = input_layout_problem(
          r, test_only ? data.test : data.train, test_only ? "data.test's" : "the training data's");
      !why.empty())
    throw UserError(why + " (checkpoint '" + path + "' records its training data's)" +
                    (test_only ? ": the test files must be laid out as the training's were"
                               : ": data.csv.label_column or the training files changed since"));
  if (test_only && r.known) data.train.columns = r.columns;
}

// eval and predict from test files (data.test) with model.num_classes 0: the output width is
// the training labels' count when the checkpoint was written, which its output layer holds; the
// test labels alone may undercount it (a test set without the top class, the training files not
// here) or overcount it (a stray label: refused, naming it). Sets data's class count to it.
void classes_from_checkpoint(const Config& cfg, const std::string& ckpt, DataSplits& data) {
  if (cfg.model.num_classes > 0) return;
  const std::string path = resolve_checkpoint(ckpt, false);
  check_config_before_build(path, cfg);  // (another architecture is named as such first)
  // (a probe of 2 classes at least: test labels of one class are no error of the model's)
  data.train.num_classes = std::max<int64_t>(2, data.train.num_classes);
  ModelShape shape = resolve_model_shape(cfg, data, /*speak=*/false);
  // A layer list's output width is its own: built for the test labels' count, a list ending in
  // {linear: 3} was refused with advice to end it in {linear: 10}, which the checkpoint fixes.
  if (const int64_t width = layer_list_width(cfg, shape.sample); width > 0)
    shape.num_classes = width;
  const Model model = build_model(cfg.model, {shape.sample, shape.num_classes});
  if (model.params().empty()) return;
  const ParamEntry& last = model.params().back();  // the output layer's, when it is [C] or [C, H]
  if (last.shape.empty() || last.shape[0] != shape.num_classes) return;
  const auto stored = checkpoint_param_shape(path, last.name);
  if (!stored || stored->empty() || (*stored)[0] < 1) return;
  const int64_t width = (*stored)[0];
  if (width < data.test.num_classes)
    throw UserError(fmt::format(
        "data.test has label {}, above the labels 0..{} of checkpoint '{}' ({} outputs, its "
        "'{}' {}): the test labels are not the ones it was trained on",
        data.test.num_classes - 1, width - 1, path, width, last.name, fmt::join(*stored, "x")));
  data.train.num_classes = width;
}

}  // namespace

namespace {

int eval_checkpoint(const Config& cfg, const std::string& ckpt) {
  check_checkpoint(ckpt, false);
  set_blas_threads(static_cast<int>(cfg.runtime.threads));
  // (text with a test file: the training text is not read, its size not checked; idx and csv
  // with test files read the training files only when they are there: the checkpoint's stored
  // normaliser scales the test rows without them)
  const bool text_test = cfg.data.format == DataFormat::kText && !cfg.data.test.empty();
  const bool test_only = test_files_only(cfg.data);
  // (load_data says it; these loaders read no training file, and said nothing)
  if (text_test || test_only)
    if (const std::string w = split_overlap_warning(cfg.data); !w.empty()) spdlog::warn("{}", w);
  DataSplits data = text_test   ? load_text_test_file(text_options(cfg.data))
                    : test_only ? load_test_files(cfg.data)
                                : load_data(cfg.data, cfg.seed);
  if (data.test.rows == 0)
    throw UserError("no test set to evaluate: set data.test or data.test_fraction");
  if (!text_test) check_input_layout(ckpt, data, test_only);
  // Test files of their own: the checkpoint's output layer gives the class count, whether the
  // training files are here or not (built for a stray test label, the model did not fit the
  // checkpoint, which was blamed).
  if (!text_test && !cfg.data.test.empty()) classes_from_checkpoint(cfg, ckpt, data);
  const LoadedModel m = load_model(cfg, data, ckpt, data.test.rows);
  if (const std::string w = held_out_split_difference(m.path, m.meta, cfg); !w.empty())
    spdlog::warn("{}", w);
  if (test_only) {
    stored_normalizer(m, cfg, data.test.features).apply(data.test);
  } else if (const Normalizer n = training_normalizer(m, data); !(n == data.normalizer)) {
    // The test rows as they are in the files, scaled as training scaled its inputs.
    DataConfig raw = cfg.data;
    raw.normalize = Normalize::kNone;
    data = DataSplits{};  // (not two copies of the data at once)
    data = load_data(raw, cfg.seed);
    n.apply(data.test);
  }
  const EvalResult r =
      evaluate(m.model, m.params.data(), data.test, cfg.data.eval_batch_size, cfg.model.loss);
  if (r.first_nonfinite >= 0) {
    // Where it is: a test file's rows are its samples in order (IDX records, CSV data rows after
    // the header, blank lines skipped); a held-out split is a seeded sample of the training rows.
    const std::string where =
        cfg.data.format == DataFormat::kCsv && cfg.data.test.path.size() == 1
            ? fmt::format(": data row {} of '{}'", r.first_nonfinite + 1, cfg.data.test.path[0])
        : cfg.data.format == DataFormat::kIdx && !cfg.data.test.images.empty()
            ? fmt::format(": image {} of '{}'", r.first_nonfinite + 1, cfg.data.test.images)
        : cfg.data.test.empty() ? " of the held-out split"
                                : "";
    throw UserError(fmt::format(
        "test sample {} (0-based, of {}{}) gives a non-finite output or loss: its values "
        "overflow the model's float32 arithmetic, or the checkpoint's weights have diverged; no "
        "test loss or accuracy to report",
        r.first_nonfinite, r.samples, where));
  }
  nlohmann::json out = {
      {"test_loss", r.loss}, {"test_accuracy", r.accuracy}, {"samples", r.samples}};
  if (cfg.data.format == DataFormat::kText) out["test_bpb"] = r.loss / std::log(2.0);
  std::cout << out.dump() << std::endl;
  return kExitOk;
}

}  // namespace

int cmd_eval(const Config& cfg, const std::string& ckpt) {
  // A run training into the folder may replace its latest checkpoint while it is read, and prune
  // the one read (train.checkpoint.keep_last): a failure while the folder's latest moved on is
  // tried again with the newer one, up to 10 times, not refused as bad input.
  for (int attempt = 1;; ++attempt) {
    std::string before;  // ("" when even resolving it failed: the file named was pruned)
    try {
      before = resolve_checkpoint(ckpt, false);
      return eval_checkpoint(cfg, ckpt);
    } catch (const UserError&) {
      std::string now;
      try {
        now = resolve_checkpoint(ckpt, false);
      } catch (const UserError&) {
      }
      // (the race, not another error: the checkpoint resolved first is gone, pruned by the run)
      std::error_code ec;
      const bool pruned = before.empty() || !std::filesystem::exists(before, ec);
      if (attempt == 10 || now.empty() || now == before || !pruned) throw;
      spdlog::info("{} was pruned while it was read (a run saving into the folder): reading {}",
                   before.empty() ? "the checkpoint latest named" : before, now);
    }
  }
}

int cmd_predict(const Config& cfg, const std::string& ckpt, const std::string& input,
                const std::string& output, CsvHeader header) {
  if (cfg.model.type == ModelType::kGpt)
    throw UserError(
        "predict classifies the rows of a CSV file with an mlp or sequential model; a gpt model "
        "continues text: use `dtrain generate` (or `dtrain eval` for its validation loss)");
  check_checkpoint(ckpt, false);
  const bool from_stdin = input == "-";
  if (const std::string why = from_stdin ? "" : input_file_problem(input); !why.empty())
    throw UserError("--input '" + input + "' " + why);
  set_blas_threads(static_cast<int>(cfg.runtime.threads));
  // For the normaliser and the shape: the training data, or where its files are not here the
  // test files' layout and the checkpoint's normaliser and output width.
  const bool test_only = test_files_only(cfg.data);
  DataSplits data = test_only ? load_test_files(cfg.data) : load_data(cfg.data, cfg.seed);
  check_input_layout(ckpt, data, test_only);
  if (!cfg.data.test.empty() && cfg.data.format != DataFormat::kText)
    classes_from_checkpoint(cfg, ckpt, data);
  // data.csv.header describes the training files; --input has its own (--input-header, auto by
  // default: a first row of names is skipped, one of numbers is data), so `header: true` cannot
  // drop a row of input, nor `header: false` refuse an input's header row as non-numeric data.
  CsvOptions in_opts = cfg.data.csv;
  in_opts.header = header;
  in_opts.header_hint = "--input-header";
  int64_t rows = 0;
  // The input is read first, so the memory check sizes the batches it will have (a few rows
  // need no evaluation batch of data.eval_batch_size).
  const int64_t F = shape_numel(resolve_model_shape(cfg, data).sample);
  std::vector<float> x;
  if (from_stdin) {
    // (a terminal: rows typed until Ctrl-D; said, since the command seems to hang otherwise)
    if (::isatty(STDIN_FILENO))
      spdlog::warn("reading CSV rows from the terminal (--input -): end them with Ctrl-D");
    x = load_csv_features_text(kStdinName, read_stdin_maybe_gzip(kStdinName), in_opts, F, &rows,
                               data.train.columns);
  } else {
    x = load_csv_features(input, in_opts, F, &rows, data.train.columns);
  }
  const LoadedModel m = load_model(cfg, data, ckpt, rows);
  DT_CHECK_EQ(m.model.in_features(), F);
  (test_only ? stored_normalizer(m, cfg, F) : training_normalizer(m, data))
      .apply_rows(x.data(), rows, F);
  // Cross-entropy's outputs are logits: their softmax is each class's probability. Under mse
  // the outputs regress the one-hot target, and are written as they are (out_k). The loss the
  // model was trained with decides (model.loss may differ here: it is what eval reports).
  const std::optional<Config> trained = stored_config(m.meta, m.path);
  const bool mse = (trained ? trained->model.loss : cfg.model.loss) == Loss::kMse;
  std::ostringstream os;
  os << "predicted";
  for (int64_t c = 0; c < m.model.out_features(); ++c) os << (mse ? ",out_" : ",prob_") << c;
  os << "\n";
  // In batches of data.eval_batch_size rows, as eval: activations stay bounded however long the
  // input is.
  Activations acts;
  Tensor probs;
  char buf[32];
  for (int64_t r0 = 0; r0 < rows; r0 += cfg.data.eval_batch_size) {
    const int64_t n = std::min(cfg.data.eval_batch_size, rows - r0);
    Tensor xt = Tensor::view(x.data() + r0 * F, {n, F});
    const Tensor& out = m.model.forward(m.params.data(), xt, acts, ForwardCtx{false, nullptr});
    if (mse)
      probs = out;  // (read before the next forward)
    else
      softmax_rows(out, probs);
    for (int64_t r = 0; r < n; ++r) {
      int64_t best = 0;
      for (int64_t c = 0; c < probs.cols(); ++c) {
        if (!std::isfinite(probs.at(r, c)))
          throw UserError(fmt::format(
              "--input '{}': row {} (1-based, of {} data rows) gives non-finite outputs: its "
              "values overflow the model's float32 arithmetic, or the checkpoint's weights have "
              "diverged",
              input, r0 + r + 1, rows));
        if (probs.at(r, c) > probs.at(r, best)) best = c;
      }
      os << best;
      for (int64_t c = 0; c < probs.cols(); ++c) {
        std::snprintf(buf, sizeof buf, ",%.6g", static_cast<double>(probs.at(r, c)));
        os << buf;
      }
      os << "\n";
    }
  }
  if (output.empty()) {
    std::cout << os.str() << std::flush;
  } else {
    write_file_atomic(output, os.str());
    spdlog::info("wrote {} predictions to {}", rows, output);
  }
  return kExitOk;
}

}  // namespace dtrain
