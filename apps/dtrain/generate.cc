#include "dtrain/generate.h"

#include <algorithm>
#include <cmath>
#include <functional>
#include <vector>

#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include "checkpoint/checkpoint.h"
#include "data/text.h"
#include "nn/model.h"
#include "nn/registry.h"
#include "nn/sampling.h"
#include "train/checkpoint_config.h"
#include "train/tied_grads.h"
#include "train/trainer.h"
#include "util/check.h"
#include "util/rng.h"
#include "util/strings.h"

namespace dtrain {
namespace {

void check_options(const Config& cfg, const GenerateOptions& o) {
  if (cfg.model.type != ModelType::kGpt)
    throw UserError("generate samples from a language model: model.type must be gpt (got " +
                    to_string(cfg.model.type) + ")");
  if (o.tokens < 0) throw UserError("--tokens must be >= 0 (got " + std::to_string(o.tokens) + ")");
  if (!(o.temperature >= 0) || !std::isfinite(o.temperature))
    throw UserError(fmt::format(
        "--temperature must be finite and >= 0 (0 = always the most likely byte; got {})",
        o.temperature));
  if (o.top_k < 0 || o.top_k > kTextVocab)
    throw UserError("--top-k must be in [0, 256] (0 = all bytes; got " + std::to_string(o.top_k) +
                    ")");
  if (o.seed && *o.seed < 0)
    throw UserError("--seed must be >= 0 (got " + std::to_string(*o.seed) + ")");
}

// The bytes s[i + 1, i + n) present so far are valid continuations of the lead s[i]; returns
// how many the sequence still lacks (0: complete), or -1 when it cannot be valid UTF-8.
int utf8_missing(const std::string& s, size_t i) {
  const Utf8Lead l = utf8_lead(static_cast<unsigned char>(s[i]));
  if (l.n == 0) return -1;
  for (size_t j = 1; j < l.n && i + j < s.size(); ++j) {
    const auto b = static_cast<unsigned char>(s[i + j]);
    if (j == 1 ? (b < l.lo || b > l.hi) : (b < 0x80 || b > 0xBF)) return -1;
  }
  const size_t have = std::min(l.n, s.size() - i);
  return static_cast<int>(l.n - have);
}

}  // namespace

std::string TerminalEscaper::push(const std::string& bytes) {
  pending_ += bytes;
  return drain(false);
}

std::string TerminalEscaper::finish() {
  return drain(true);
}

std::string TerminalEscaper::drain(bool final) {
  static const char* const kHex = "0123456789abcdef";
  std::string out;
  size_t i = 0;
  while (i < pending_.size()) {
    const auto c = static_cast<unsigned char>(pending_[i]);
    const bool control = (c < 0x20 && c != '\t' && c != '\n' && c != '\r') || c == 0x7F;
    const int missing = control ? -1 : utf8_missing(pending_, i);
    if (c == '\\') {  // so that \xNN in the output always means an escaped byte
      out += "\\\\";
      ++i;
    } else if (missing == 0 && c == 0xC2 && static_cast<unsigned char>(pending_[i + 1]) < 0xA0) {
      // U+0080-U+009F, the C1 controls (U+009B is an 8-bit CSI some terminals act on): escaped
      // byte by byte like the C0 controls.
      for (size_t k = i; k < i + 2; ++k) {
        const auto b = static_cast<unsigned char>(pending_[k]);
        out += "\\x";
        out += kHex[b >> 4];
        out += kHex[b & 15];
      }
      i += 2;
    } else if (missing == 0) {
      const size_t n = utf8_lead(c).n;
      out.append(pending_, i, n);
      i += n;
    } else if (missing > 0 && !final) {
      break;  // a character still arriving
    } else {
      out += "\\x";
      out += kHex[c >> 4];
      out += kHex[c & 15];
      ++i;
    }
  }
  pending_.erase(0, i);
  return out;
}

std::string escape_for_terminal(const std::string& bytes) {
  TerminalEscaper e;
  std::string out = e.push(bytes);  // before finish(): the operands of + are unsequenced
  return out + e.finish();
}

std::string generate_text(const Config& cfg, const GenerateOptions& o,
                          const std::function<void(const std::string&)>& emit) {
  check_options(cfg, o);
  check_checkpoint(o.checkpoint, false);
  const std::string path = resolve_checkpoint(o.checkpoint, false);
  check_config_before_build(path, cfg);
  const int64_t T = cfg.model.block_size;
  const Model model = build_model(cfg.model, {{T}, kTextVocab});
  check_eval_memory(cfg, model, 1, /*generate=*/true);  // one sequence at a time
  std::vector<float> params(static_cast<size_t>(model.param_count()));
  try {
    load_checkpoint(path, model, params.data(), {});
  } catch (const ModelMismatchError& e) {
    throw UserError(std::string(e.what()) +
                    " (generate builds the model from the config: give the one it was trained "
                    "with)");
  }
  check_tied_copies(model, params.data(), {}, path);
  spdlog::debug("generate: loaded {}", path);
  if (static_cast<int64_t>(o.prompt.size()) > T)
    spdlog::warn(
        "the prompt has {} bytes, more than model.block_size = {}: the model sees its "
        "last {}",
        o.prompt.size(), T, T);

  // Token ids as exact floats; `seq` holds the context source (prompt or '\n', then the output).
  std::string seq = o.prompt.empty() ? std::string("\n") : o.prompt;
  std::string out = o.prompt;
  Rng rng(static_cast<uint64_t>(o.seed.value_or(cfg.seed)));
  Tensor x({1, T});
  Activations acts;
  if (emit) emit(o.prompt);
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
    if (emit) emit(std::string(1, static_cast<char>(next)));
  }
  return out;
}

}  // namespace dtrain
