// Text helpers of lib/config: "did you mean" suggestions and message pieces.
#include "config/internal.h"

#include <algorithm>
#include <cctype>
#include <charconv>
#include <limits>
#include <string_view>
#include <utility>

#include "config/schema.h"
#include "util/strings.h"

namespace dtrain::config_detail {
namespace {

// Optimal string alignment distance: Levenshtein plus adjacent transpositions ("wieght").
size_t edit_distance(std::string_view a, std::string_view b) {
  std::vector<std::vector<size_t>> d(a.size() + 1, std::vector<size_t>(b.size() + 1));
  for (size_t i = 0; i <= a.size(); ++i) d[i][0] = i;
  for (size_t j = 0; j <= b.size(); ++j) d[0][j] = j;
  for (size_t i = 1; i <= a.size(); ++i) {
    for (size_t j = 1; j <= b.size(); ++j) {
      const size_t cost = a[i - 1] == b[j - 1] ? 0 : 1;
      d[i][j] = std::min({d[i - 1][j] + 1, d[i][j - 1] + 1, d[i - 1][j - 1] + cost});
      if (i > 1 && j > 1 && a[i - 1] == b[j - 2] && a[i - 2] == b[j - 1]) {
        d[i][j] = std::min(d[i][j], d[i - 2][j - 2] + 1);
      }
    }
  }
  return d[a.size()][b.size()];
}

}  // namespace

std::string join_key(std::string_view prefix, std::string_view key) {
  std::string out(prefix);
  if (!out.empty()) out += '.';
  out += key;
  return out;
}

std::string join_list(const KeyList& list, std::string_view sep) {
  std::string out;
  for (std::string_view s : list) {
    if (!out.empty()) out += sep;
    out += s;
  }
  return out;
}

std::string show(int64_t v) {
  return std::to_string(v);
}

std::string show(double v) {
  char buf[64];
  const auto r = std::to_chars(buf, buf + sizeof buf, v);
  return std::string(buf, r.ptr);
}

std::string closest(std::string_view word, const KeyList& candidates) {
  const std::string w = ascii_lower(word);
  std::string best;
  size_t best_d = std::numeric_limits<size_t>::max();
  for (std::string_view c : candidates) {
    // Longer than c by more than 3 (the largest limit): neither close nor a prefix of c, and
    // the distance's table would be |word| x |c| (a pasted megabyte took seconds and gigabytes).
    if (c.empty() || w.size() > c.size() + 3) continue;
    const std::string lc = ascii_lower(c);
    const size_t d = edit_distance(w, lc);
    const size_t limit = std::max<size_t>(1, std::min<size_t>(3, lc.size() / 3));
    const bool prefix = w.size() >= 3 && lc.starts_with(w);
    if ((d <= limit || prefix) && d < best_d) {
      best = std::string(c);
      best_d = d;
    }
  }
  return best;
}

namespace {

// Other trainers' names for dtrain's keys (PyTorch scripts, Hugging Face's TrainingArguments,
// Lightning, nanoGPT's train.py), too far from dtrain's spelling for closest() to find them.
constexpr std::pair<std::string_view, std::string_view> kSynonyms[] = {
    {"learning_rate", "optimizer.lr"},
    {"num_threads", "runtime.threads"},
    {"n_threads", "runtime.threads"},
    {"nthreads", "runtime.threads"},
    {"hidden_size", "model.hidden"},
    {"hidden_sizes", "model.hidden"},
    {"hidden_dims", "model.hidden"},
    {"hidden_layers", "model.hidden"},
    {"steps", "train.max_steps"},
    {"num_steps", "train.max_steps"},
    {"max_iters", "train.max_steps"},
    {"total_steps", "train.max_steps"},
    {"train_steps", "train.max_steps"},
    {"num_epochs", "train.epochs"},
    {"num_train_epochs", "train.epochs"},
    {"max_epochs", "train.epochs"},
    {"n_epochs", "train.epochs"},
    {"test_split", "data.test_fraction"},
    {"val_split", "data.test_fraction"},
    {"validation_split", "data.test_fraction"},
    {"val_fraction", "data.test_fraction"},
    {"random_seed", "seed"},
    {"manual_seed", "seed"},
    {"rng_seed", "seed"},
    {"strategy_type", "distributed.strategy"},
    {"checkpoint_every", "train.checkpoint.every_steps"},
    {"save_every", "train.checkpoint.every_steps"},
    {"save_steps", "train.checkpoint.every_steps"},
    {"checkpoint_interval", "train.checkpoint.every_steps"},
    {"save_total_limit", "train.checkpoint.keep_last"},
    {"eval_interval", "train.eval_every"},
    {"eval_steps", "train.eval_every"},
    {"log_interval", "train.log_every"},
    {"logging_steps", "train.log_every"},
    {"gradient_accumulation_steps", "train.grad_accum_steps"},
    {"grad_accum", "train.grad_accum_steps"},
    {"max_grad_norm", "optimizer.clip_grad_norm"},
    {"grad_clip", "optimizer.clip_grad_norm"},
    {"warmup", "optimizer.schedule.warmup_steps"},
    {"lr_scheduler", "optimizer.schedule.type"},
    {"lr_scheduler_type", "optimizer.schedule.type"},
    {"train_batch_size", "data.batch_size"},
    {"per_device_train_batch_size", "data.batch_size"},
    {"nproc_per_node", "distributed.world_size"},
    {"num_layers", "model.n_layer"},
    {"n_heads", "model.n_head"},
    {"num_heads", "model.n_head"},
    {"d_model", "model.n_embd"},
    {"context_length", "model.block_size"},
    {"seq_len", "model.block_size"},
};

}  // namespace

std::string key_suggestion(std::string_view section, std::string_view key) {
  const auto& sections = config_sections();
  if (key == "<<") return " (YAML merge keys '<<' are not supported: write the keys out)";
  // A dotted path as --set spells it, written as one YAML key: nested in a file.
  // (".seed", "a..b" or "seed." are no --set path: --set refuses them too)
  if (const size_t dot = key.rfind('.'); dot != std::string_view::npos && key.front() != '.' &&
                                         key.back() != '.' &&
                                         key.find("..") == std::string_view::npos) {
    const std::string full = join_key(section, key);
    const size_t at = full.rfind('.');
    const auto sec = sections.find(std::string_view(full).substr(0, at));
    const std::string_view leaf = std::string_view(full).substr(at + 1);
    if (sec != sections.end() &&
        std::find(sec->second.begin(), sec->second.end(), leaf) != sec->second.end())
      return " ('" + full + "' is --set's spelling: in YAML nest it, as " +
             std::string(key.substr(0, key.find('.'))) + ": {...})";
  }
  std::string s = closest(key, sections.find(section)->second);
  if (s.empty()) {
    const std::string lk = ascii_lower(key);
    std::vector<std::string> found;
    for (const auto& [sec, keys] : sections) {
      for (std::string_view k : keys) {
        if (sec != section && ascii_lower(k) == lk) found.push_back(join_key(sec, k));
      }
    }
    if (found.size() == 1) s = found[0];
  }
  if (s.empty()) {
    const std::string lk = ascii_lower(key);
    for (const auto& [other, ours] : kSynonyms)
      if (lk == other) s = std::string(ours);
  }
  return s.empty() ? std::string() : " (did you mean '" + s + "'?)";
}

std::string enum_problem(const std::string& got, const KeyList& choices) {
  std::string msg =
      "must be one of " + join_list(choices, ", ") + " (got '" + shown_text(got, 200) + "'";
  const std::string s = closest(got, choices);
  if (!s.empty()) msg += "; did you mean '" + s + "'?";
  return msg + ")";
}

}  // namespace dtrain::config_detail
