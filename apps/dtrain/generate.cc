#include "dtrain/generate.h"

#include <cmath>
#include <vector>

#include <spdlog/spdlog.h>

#include "checkpoint/checkpoint.h"
#include "data/text.h"
#include "nn/model.h"
#include "nn/registry.h"
#include "nn/sampling.h"
#include "train/trainer.h"
#include "util/check.h"
#include "util/rng.h"

namespace dtrain {
namespace {

void check_options(const Config& cfg, const GenerateOptions& o) {
  if (cfg.model.type != ModelType::kGpt)
    throw UserError("generate samples from a language model: model.type must be gpt (got " +
                    to_string(cfg.model.type) + ")");
  if (o.tokens < 0) throw UserError("--tokens must be >= 0 (got " + std::to_string(o.tokens) + ")");
  if (!(o.temperature >= 0) || !std::isfinite(o.temperature))
    throw UserError("--temperature must be >= 0 (0 = always the most likely byte; got " +
                    std::to_string(o.temperature) + ")");
  if (o.top_k < 0 || o.top_k > kTextVocab)
    throw UserError("--top-k must be in [0, 256] (0 = all bytes; got " + std::to_string(o.top_k) +
                    ")");
  if (o.seed < -1) throw UserError("--seed must be >= 0 (got " + std::to_string(o.seed) + ")");
}

// Length of the valid UTF-8 sequence starting at s[i] (1..4), or 0 when it is not one.
size_t utf8_length(const std::string& s, size_t i) {
  const auto b = [&s](size_t j) { return static_cast<unsigned char>(s[j]); };
  const unsigned char c = b(i);
  if (c < 0x80) return 1;
  size_t n = 0;
  unsigned char lo = 0x80, hi = 0xBF;  // the allowed range of the second byte
  if (c >= 0xC2 && c <= 0xDF) {
    n = 2;
  } else if (c >= 0xE0 && c <= 0xEF) {
    n = 3;
    if (c == 0xE0) lo = 0xA0;  // no overlong forms
    if (c == 0xED) hi = 0x9F;  // no surrogates
  } else if (c >= 0xF0 && c <= 0xF4) {
    n = 4;
    if (c == 0xF0) lo = 0x90;
    if (c == 0xF4) hi = 0x8F;  // nothing above U+10FFFF
  } else {
    return 0;
  }
  if (i + n > s.size()) return 0;
  if (b(i + 1) < lo || b(i + 1) > hi) return 0;
  for (size_t j = 2; j < n; ++j)
    if (b(i + j) < 0x80 || b(i + j) > 0xBF) return 0;
  return n;
}

}  // namespace

std::string escape_for_terminal(const std::string& bytes) {
  static const char* const kHex = "0123456789abcdef";
  std::string out;
  out.reserve(bytes.size());
  for (size_t i = 0; i < bytes.size();) {
    const auto c = static_cast<unsigned char>(bytes[i]);
    const bool control = (c < 0x20 && c != '\t' && c != '\n' && c != '\r') || c == 0x7F;
    const size_t n = control ? 0 : utf8_length(bytes, i);
    if (c == '\\') {  // so that \xNN in the output always means an escaped byte
      out += "\\\\";
      ++i;
    } else if (n == 0) {
      out += "\\x";
      out += kHex[c >> 4];
      out += kHex[c & 15];
      ++i;
    } else {
      out.append(bytes, i, n);
      i += n;
    }
  }
  return out;
}

std::string generate_text(const Config& cfg, const GenerateOptions& o) {
  check_options(cfg, o);
  check_checkpoint(o.checkpoint, false);
  const int64_t T = cfg.model.block_size;
  const Model model = build_model(cfg.model, {{T}, kTextVocab});
  std::vector<float> params(static_cast<size_t>(model.param_count()));
  const std::string path = resolve_checkpoint(o.checkpoint, false);
  CheckpointMeta meta;
  try {
    meta = load_checkpoint(path, model, params.data(), {});
  } catch (const UserError& e) {
    throw UserError(std::string(e.what()) +
                    " (generate builds the model from the config: give the one it was trained "
                    "with)");
  }
  check_model_config(path, meta, cfg);
  spdlog::debug("generate: loaded {}", path);
  if (static_cast<int64_t>(o.prompt.size()) > T)
    spdlog::warn(
        "the prompt has {} bytes, more than model.block_size = {}: the model sees its "
        "last {}",
        o.prompt.size(), T, T);

  // Token ids as exact floats; `seq` holds the context source (prompt or '\n', then the output).
  std::string seq = o.prompt.empty() ? std::string("\n") : o.prompt;
  std::string out = o.prompt;
  Rng rng(static_cast<uint64_t>(o.seed < 0 ? cfg.seed : o.seed));
  Tensor x({1, T});
  Activations acts;
  for (int64_t step = 0; step < o.tokens; ++step) {
    const int64_t len = std::min<int64_t>(T, static_cast<int64_t>(seq.size()));
    const size_t start = seq.size() - static_cast<size_t>(len);
    float* xp = x.data();
    for (int64_t t = 0; t < T; ++t)
      xp[t] = t < len ? static_cast<float>(static_cast<unsigned char>(seq[start + t])) : 0.0f;
    const Tensor& logits = model.forward(params.data(), x, acts, ForwardCtx{false, nullptr});
    DT_CHECK_EQ(logits.numel(), T * kTextVocab);
    const int64_t next = sample_next(logits.data() + (len - 1) * kTextVocab, kTextVocab,
                                     o.temperature, o.top_k, rng);
    seq += static_cast<char>(next);
    out += static_cast<char>(next);
  }
  return out;
}

}  // namespace dtrain
