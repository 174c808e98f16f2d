// dtrain generate: a continuation of a prompt sampled from a GPT checkpoint, byte by byte.
#pragma once

#include <cstdint>
#include <functional>
#include <optional>
#include <string>

#include "config/config.h"

namespace dtrain {

struct GenerateOptions {
  std::string checkpoint;       // a file, a sharded checkpoint folder, or a run/checkpoints folder
  std::string prompt;           // bytes; "" starts from a single '\n' (not printed)
  int64_t tokens = 200;         // bytes to generate, >= 0
  double temperature = 0.8;     // >= 0; 0 = greedy (argmax)
  int64_t top_k = 0;            // 0..256; 0 = all 256 bytes
  std::optional<int64_t> seed;  // >= 0; none: the config's seed
};

// The prompt followed by `tokens` sampled bytes. The model is cfg.model (model.type gpt) built
// for [block_size] byte inputs, with the checkpoint's weights. Each step feeds the last
// block_size bytes of prompt + generated so far, padded after the end to block_size positions
// (causal attention: the padding does not reach earlier positions, so this equals a forward of
// the shorter context), and draws from the last real position's 256 logits with sample_next
// (nn/sampling.h) and an Rng seeded by the seed: the same inputs give the same bytes.
// UserError (one line) for a model that is not gpt, a checkpoint of another model (its first
// differing tensor named), tokens < 0, temperature < 0 or not finite, top_k outside [0, 256],
// seed < 0. A prompt longer than block_size is noted once on stderr (the model sees its tail).
// emit, when given, receives the prompt once the checkpoint has loaded, then each byte as it is
// sampled (for printing as it goes).
std::string generate_text(const Config& cfg, const GenerateOptions& o,
                          const std::function<void(const std::string&)>& emit = {});

// escape_for_terminal for bytes that arrive a few at a time: push returns what can be printed
// so far (a UTF-8 character still arriving waits for its last byte), finish the rest. The
// concatenated output equals escape_for_terminal of all the bytes at once.
class TerminalEscaper {
 public:
  std::string push(const std::string& bytes);
  std::string finish();

 private:
  std::string drain(bool final);
  std::string pending_;  // bytes of an incomplete character
};

// `bytes` for a terminal: valid UTF-8 as it is, every other byte as \xNN (two lower-case hex
// digits); control characters other than \t, \n and \r, and DEL, are escaped the same way, and a
// backslash is doubled, so the output reads back unambiguously.
std::string escape_for_terminal(const std::string& bytes);

}  // namespace dtrain
