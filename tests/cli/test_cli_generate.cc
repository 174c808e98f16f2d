// dtrain generate: the output escaping, the one-line errors for bad options and models, and (with
// a tiny GPT trained for a few steps) determinism for a seed.
#include <doctest/doctest.h>

#include <algorithm>
#include <string>

#include "dtrain/generate.h"
#include "test_util.h"

using dtrain::testing::CmdResult;
using dtrain::testing::run_cmd;
using dtrain::testing::TempDir;

namespace {

const std::string kBin = DTRAIN_BIN;

CmdResult run_dtrain(const std::string& args) {
  return run_cmd(kBin + " " + args);
}

// A tiny GPT on a small text file (about 8 KB of repetitive English).
std::string tiny_gpt(const TempDir& t) {
  std::string text;
  for (int i = 0; i < 120; ++i)
    text += "the quick brown fox " + std::to_string(i % 7) + " jumps over the lazy dog.\n";
  t.write("corpus.txt", text);
  return t.write("gpt.yaml", R"(seed: 5
model: {type: gpt, n_layer: 1, n_head: 2, n_embd: 16, block_size: 16}
data: {format: text, train: {path: corpus.txt}, batch_size: 8, eval_batch_size: 64}
optimizer: {type: adamw, lr: 0.003}
train: {epochs: 0, max_steps: 5, log_every: 5}
)");
}

}  // namespace

namespace dtrain {

TEST_CASE("generate: escape_for_terminal keeps valid UTF-8 and escapes every other byte") {
  CHECK(escape_for_terminal("plain\ttext\r\n") == "plain\ttext\r\n");
  CHECK(escape_for_terminal("caf\xc3\xa9 \xe2\x82\xac \xf0\x9f\x98\x80") ==
        "caf\xc3\xa9 \xe2\x82\xac \xf0\x9f\x98\x80");
  CHECK(escape_for_terminal(std::string("a\0b", 3)) == "a\\x00b");
  CHECK(escape_for_terminal("\x1b[31m\x7f") == "\\x1b[31m\\x7f");
  // A lone continuation byte, a truncated sequence, overlong forms, a surrogate, > U+10FFFF.
  CHECK(escape_for_terminal("\x80") == "\\x80");
  CHECK(escape_for_terminal("x\xc3") == "x\\xc3");
  CHECK(escape_for_terminal("\xe2\x82z") == "\\xe2\\x82z");
  CHECK(escape_for_terminal("\xc0\xaf") == "\\xc0\\xaf");
  CHECK(escape_for_terminal("\xe0\x80\xaf") == "\\xe0\\x80\\xaf");
  CHECK(escape_for_terminal("\xed\xa0\x80") == "\\xed\\xa0\\x80");
  CHECK(escape_for_terminal("\xf4\x90\x80\x80") == "\\xf4\\x90\\x80\\x80");
  CHECK(escape_for_terminal("\xff\xfe") == "\\xff\\xfe");
}

TEST_CASE("generate: bad options and a model that is not gpt exit 2 with one line") {
  TempDir t;
  const std::string gpt = tiny_gpt(t);
  const std::string mlp = t.write(
      "mlp.yaml", "model: {hidden: [4]}\ndata: {format: synthetic}\ntrain: {max_steps: 1}\n");
  const std::string ck = " --checkpoint " + t / "none";
  struct Case {
    std::string args, message;
  };
  const Case cases[] = {
      {mlp + ck, "error: generate samples from a language model: model.type must be gpt (got mlp)"},
      {gpt + ck + " --tokens -1", "error: --tokens must be >= 0 (got -1)"},
      {gpt + ck + " --temperature -0.5", "error: --temperature must be >= 0"},
      {gpt + ck + " --top-k 257", "error: --top-k must be in [0, 256] (0 = all bytes; got 257)"},
      {gpt + ck + " --top-k -1", "error: --top-k must be in [0, 256]"},
      {gpt + ck, "error: checkpoint '" + t / "none" + "'"},
  };
  for (const Case& c : cases) {
    const CmdResult r = run_dtrain("generate " + c.args);
    INFO(c.args << "\n" << r.output);
    CHECK(r.exit_code == 2);
    CHECK(r.output.starts_with(c.message));
    CHECK(std::count(r.output.begin(), r.output.end(), '\n') == 1);
  }
}

}  // namespace dtrain
