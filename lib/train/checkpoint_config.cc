#include "train/checkpoint_config.h"

#include <algorithm>
#include <filesystem>
#include <system_error>
#include <vector>

#include <spdlog/spdlog.h>
#include <nlohmann/json.hpp>

#include "checkpoint/safetensors.h"
#include "config/config_diff.h"
#include "config/schema.h"
#include "data/dataset.h"
#include "data/text.h"
#include "train/trainer.h"
#include "util/check.h"
#include "util/strings.h"
#include "util/warn_once.h"

namespace dtrain {

void report_config_changes(const std::string& path, const CheckpointMeta& m, const Config& cfg,
                           const std::string& hash) {
  if (m.config_json.empty()) {
    if (m.config_hash != hash)
      spdlog::warn("resuming from {} written with config hash {}, this run has {}", path,
                   m.config_hash, hash);
    return;
  }
  nlohmann::json before;
  try {
    before = nlohmann::json::parse(m.config_json);
  } catch (const nlohmann::json::exception&) {
    throw UserError("checkpoint '" + path + "': its stored config is not valid JSON");
  }
  std::vector<std::string> diff;
  try {
    diff = config_differences(before, config_to_json(cfg));
  } catch (const nlohmann::json::exception& e) {  // (config_differences takes any JSON)
    throw UserError("checkpoint '" + path + "': its stored config is malformed (" +
                    json_error_text(e.what()) + ")");
  }
  std::string lines;
  for (const auto& d : diff) lines += "\n  " + d;
  // (equal resolved configs with different hashes: the hash's own rule changed since -- a
  // data.synthetic.seed spelt out as the top-level seed hashes as -1 now -- not the run)
  if (diff.empty()) return;
  if (m.config_hash != hash)
    spdlog::warn("resuming from {} under a changed config (hash {} -> {}); {} key(s) differ:{}",
                 path, m.config_hash, hash, diff.size(), lines);
  else
    spdlog::info("resuming from {}; changed since it was written (not what is computed):{}", path,
                 lines);
}

std::optional<Config> stored_config(const CheckpointMeta& m, const std::string& path,
                                    std::string* why) {
  if (m.config_json.empty()) return std::nullopt;
  try {
    return parse_config(m.config_json, path);
  } catch (const UserError& e) {
    if (why) *why = e.what();
    return std::nullopt;
  }
}

namespace {

// A sequential model's layer lists as a difference line ("" when they compute the same function):
// a dropout's probability is inert outside training (as model.dropout is), so {dropout: p}
// against {dropout: q} is none; else the first entry that differs, not both whole lists.
std::string layers_difference(const nlohmann::json& was, const nlohmann::json& now) {
  const auto inert = [](nlohmann::json layers) {
    if (layers.is_array())
      for (nlohmann::json& l : layers)
        if (l.is_object() && l.contains("dropout")) l = "dropout";
    return layers;
  };
  if (inert(was) == inert(now)) return "";
  if (!was.is_array() || !now.is_array() || was.size() != now.size())
    return "\n  model.layers: " + std::to_string(was.size()) + " entries -> " +
           std::to_string(now.size()) + " (" + was.dump() + " -> " + now.dump() + ")";
  size_t i = 0;
  while (inert(nlohmann::json::array({was[i]})) == inert(nlohmann::json::array({now[i]}))) ++i;
  return "\n  model.layers[" + std::to_string(i) + "]: " + was[i].dump() + " -> " + now[i].dump();
}

}  // namespace

void check_model_config(const std::string& path, const CheckpointMeta& m, const Config& cfg) {
  std::string why;
  const std::optional<Config> stored = stored_config(m, path, &why);
  if (!stored) {  // older checkpoints: the shapes are all there is to check
    if (!why.empty())
      spdlog::warn("checkpoint '{}': its stored config does not load ({}); not compared", path,
                   why);
    else  // (an n_head that differs keeps every shape: said, not silent)
      warn_once("checkpoint '" + path +
                "' stores no config (an older dtrain's, or another tool's): only its tensors' "
                "shapes are checked against the config's model, not keys such as model.n_head "
                "that keep every shape");
    return;
  }
  const Config& before = *stored;
  // Keys that do not change the function the weights compute: dropout is off outside training,
  // init is overwritten by the weights, the loss is what eval reports, not what the model is.
  static const std::vector<std::string> kInert = {"model.dropout", "model.init", "model.loss"};
  static const std::vector<std::string> kFromData = {"model.input_features", "model.num_classes"};
  std::string lines;
  for (const KeyDecl& d : config_keys()) {
    if (!d.path.starts_with("model.") || d.json_as_default ||  // complexity: hidden has it
        std::find(kInert.begin(), kInert.end(), d.path) != kInert.end())
      continue;
    // A key of another model type (model.hidden under a gpt) is no difference between the two:
    // when the types differ, model.type says so.
    if (!d.applies_to(before) || !d.applies_to(cfg)) continue;
    const nlohmann::json was = d.get(before), now = d.get(cfg);
    // 0 = from the data: against a number it may be the same model (the weights' shapes, checked
    // as they load, tell; a number the data contradicts is refused with the data).
    if (std::find(kFromData.begin(), kFromData.end(), d.path) != kFromData.end() &&
        (was == 0 || now == 0))
      continue;
    if (d.path == "model.layers") {
      lines += layers_difference(was, now);
      continue;
    }
    if (was != now) lines += "\n  " + d.path + ": " + was.dump() + " -> " + now.dump();
  }
  // data.normalize as the data is scaled: `auto` is scale for idx and standardize for csv, so
  // `auto` against the value it resolves to is no change. Text is not normalised.
  const Normalize n0 = resolved_normalize(before.data), n1 = resolved_normalize(cfg.data);
  const auto shown = [](const DataConfig& d, Normalize resolved) {
    const std::string given = nlohmann::json(to_string(d.normalize)).dump();  // (quoted)
    return d.normalize == Normalize::kAuto ? given + " (" + to_string(resolved) + ")" : given;
  };
  if (cfg.data.format != DataFormat::kText && before.data.format != DataFormat::kText && n0 != n1)
    lines += "\n  data.normalize: " + shown(before.data, n0) + " -> " + shown(cfg.data, n1);
  // An mlp's dropout is a layer of its own once > 0, which renumbers the `layers.<i>` names
  // after it (as in PyTorch's nn.Sequential): 0 against > 0 is another parameter table.
  const double d0 = before.model.dropout, d1 = cfg.model.dropout;
  if (cfg.model.type == ModelType::kMlp && before.model.type == ModelType::kMlp &&
      (d0 > 0) != (d1 > 0))
    lines += "\n  model.dropout: " + nlohmann::json(d0).dump() + " -> " +
             nlohmann::json(d1).dump() +
             " (an mlp's dropout layers, present only when > 0, number its layers; any value > 0 "
             "loads)";
  if (!lines.empty())
    throw UserError("checkpoint '" + path +
                    "' was trained with another model config (checkpoint -> this config):" + lines +
                    "\nthe weights would compute something else: give the config it was trained "
                    "with (its run folder's config.json)");
}

namespace {

// The files a split reads, resolved (symlinks, "..", "//"; text patterns expanded): two configs
// that spell the same files otherwise read the same rows. A name that does not resolve stays as
// it is spelt.
nlohmann::json resolved_files(const SplitFiles& f, DataFormat format) {
  std::vector<std::string> path = f.path;
  if (format == DataFormat::kText) try {
      path = expand_text_paths(f.path, "data.train.path");
    } catch (const UserError&) {  // (what the run or eval says when it loads them)
    }
  const auto resolve = [](const std::string& p) {
    std::error_code ec;
    const std::filesystem::path c = std::filesystem::weakly_canonical(p, ec);
    return p.empty() || ec ? p : c.string();
  };
  for (std::string& p : path) p = resolve(p);
  return {resolve(f.images), resolve(f.labels), path};
}

}  // namespace

std::string held_out_split_difference(const std::string& path, const CheckpointMeta& m,
                                      const Config& cfg) {
  if (!cfg.data.test.empty()) return "";
  const std::optional<Config> stored = stored_config(m, path);
  if (!stored) return "";
  const DataConfig &was = stored->data, &now = cfg.data;
  if (!was.test.empty())
    return "checkpoint '" + path +
           "' was trained with test files of its own (data.test); this evaluates a held-out part "
           "of the training data, which the model trained on: its figures are optimistic (give "
           "the training's data.test)";
  std::string lines;
  const auto differ = [&lines](const std::string& key, const nlohmann::json& a,
                               const nlohmann::json& b) {
    if (a != b) lines += "\n  " + key + ": " + a.dump() + " -> " + b.dump();
  };
  // Text holds out its tail (no seed); the other formats a seeded sample of the rows, and
  // synthetic data is drawn from the seed too.
  if (now.format != DataFormat::kText) differ("seed", stored->seed, cfg.seed);
  // (a smaller fraction holds out part of the same rows: text's tail, the seeded order's first
  // rows; only a larger one reaches into the trained rows)
  if (const double f0 = resolved_test_fraction(was), f1 = resolved_test_fraction(now); f1 > f0)
    differ("data.test_fraction", f0, f1);
  if (now.format == DataFormat::kSynthetic) {
    const SyntheticOptions &a = was.synthetic, &b = now.synthetic;
    // (key by key: a JSON array of the values printed as ["", "", [...]])
    differ("data.synthetic.samples", a.samples, b.samples);
    differ("data.synthetic.features", a.features, b.features);
    differ("data.synthetic.classes", a.classes, b.classes);
    differ("data.synthetic.noise", a.noise, b.noise);
    // (as the data is drawn: -1 is the top-level seed, whose change is said above)
    if (a.seed != b.seed &&
        (a.seed == -1 ? stored->seed : a.seed) != (b.seed == -1 ? cfg.seed : b.seed))
      differ("data.synthetic.seed", a.seed, b.seed);
  } else if (resolved_files(was.train, was.format) != resolved_files(now.train, now.format)) {
    if (now.format == DataFormat::kIdx) {
      differ("data.train.images", was.train.images, now.train.images);
      differ("data.train.labels", was.train.labels, now.train.labels);
    } else {
      differ("data.train.path", was.train.path, now.train.path);
    }
  }
  if (lines.empty()) return "";
  return "the held-out test split is drawn otherwise than in the run checkpoint '" + path +
         "' was trained in (training -> this config):" + lines +
         (now.format == DataFormat::kSynthetic
              ? "\nthe rows evaluated are not the training's held-out rows (synthetic data "
                "is drawn from these keys), so the figures are not the run's: "
              : "\nthe rows evaluated may include rows the model trained on (or come from other "
                "data), so the figures are not the run's: ") +
         "evaluate with the training's values (its run folder's config.json)";
}

void check_config_before_build(const std::string& resolved, const Config& cfg) {
  CheckpointMeta header;
  header.config_json = checkpoint_config_json(resolved);
  check_model_config(resolved, header, cfg);
}

void check_input_record_fits(const DataSplits& data) {
  if (data.train.kind != SampleKind::kFeatures) return;
  // (10 MB for the rest: the config, every rank's RNG state, the tensor table)
  constexpr uint64_t kRoom = 10'000'000;
  const uint64_t bytes = input_record_json(data.normalizer, data.train).size();
  if (bytes + kRoom <= kStMaxHeaderBytes) return;
  throw UserError(fmt::format(
      "the training data's {} features make the input record a checkpoint stores (its "
      "normalisation statistics{}) {} MB of its header, over what a safetensors header may hold "
      "({} MB with the rest; Python's safetensors has the same limit): use data.normalize: none{}",
      data.train.features, data.train.columns.empty() ? std::string() : " and the column names",
      bytes / 1'000'000, kStMaxHeaderBytes / 1'000'000,
      data.train.columns.empty() ? " or smaller inputs"
                                 : ", shorter column names or fewer columns"));
}

}  // namespace dtrain
