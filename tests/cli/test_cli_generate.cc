// dtrain generate: the output escaping, the one-line errors for bad options and models, and, with
// a tiny GPT trained for a few steps, the contract end to end: the prompt followed by --tokens
// bytes, the same bytes for the same seed, greedy (temperature 0 or top-k 1) independent of the
// seed and equal to the argmax continuation computed here; and checkpoints that do not fit the
// config (another model, another width, fewer positions) as one-line errors naming what differs,
// in generate, eval and resume alike.
#include <doctest/doctest.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <random>
#include <string>
#include <vector>

#include "checkpoint/checkpoint.h"
#include "checkpoint/integrity_util.h"
#include "config/config.h"
#include "dtrain/generate.h"
#include "nn/registry.h"
#include "test_util.h"

using dtrain::testing::CmdResult;
using dtrain::testing::contains;
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

// Trains the tiny GPT for `steps` steps into dir/run; returns its last checkpoint.
std::string train_tiny_gpt(const TempDir& t, const std::string& cfg, int steps) {
  const CmdResult r = run_dtrain("run " + cfg + " --out " + t / "run" + " --log-level warn" +
                                 " --set train.max_steps=" + std::to_string(steps));
  INFO(r.output);
  REQUIRE(r.exit_code == 0);
  return t / "run/checkpoints";
}

// generate's standard output alone (the warnings on stderr dropped), the trailing newline off.
std::string generate_out(const std::string& cfg, const std::string& ck, const std::string& args) {
  const CmdResult r = run_cmd("(" + kBin + " generate " + cfg + " --checkpoint " + ck + " " + args +
                              " 2>/dev/null)");
  INFO(args << "\n" << r.output);
  REQUIRE(r.exit_code == 0);
  REQUIRE(r.output.ends_with("\n"));
  return r.output.substr(0, r.output.size() - 1);
}

// The bytes escape_for_terminal printed: \xNN back to the byte, \\ to a backslash.
std::string unescape(const std::string& s) {
  std::string out;
  for (size_t i = 0; i < s.size(); ++i) {
    if (s[i] == '\\' && i + 1 < s.size() && s[i + 1] == '\\') {
      out += '\\';
      ++i;
    } else if (s[i] == '\\' && i + 3 < s.size() && s[i + 1] == 'x') {
      out += static_cast<char>(std::stoi(s.substr(i + 2, 2), nullptr, 16));
      i += 3;
    } else {
      out += s[i];
    }
  }
  return out;
}

}  // namespace

namespace dtrain {

TEST_CASE("generate: escape_for_terminal keeps valid UTF-8 and escapes every other byte") {
  CHECK(escape_for_terminal("plain\ttext\r\n") == "plain\ttext\r\n");
  CHECK(escape_for_terminal("caf\xc3\xa9 \xe2\x82\xac \xf0\x9f\x98\x80") ==
        "caf\xc3\xa9 \xe2\x82\xac \xf0\x9f\x98\x80");
  CHECK(escape_for_terminal(std::string("a\0b", 3)) == "a\\x00b");
  // A typed "\x01" and the byte 0x01 print differently: the backslash is doubled.
  CHECK(escape_for_terminal("\\x01") == "\\\\x01");
  CHECK(escape_for_terminal("\x01") == "\\x01");
  CHECK(escape_for_terminal("\x1b[31m\x7f") == "\\x1b[31m\\x7f");
  // The C1 controls U+0080-U+009F (U+009B is an 8-bit CSI), byte by byte; U+00A0 is text.
  CHECK(escape_for_terminal("A\xc2\x9b"
                            "31mB") ==
        "A\\xc2\\x9b"
        "31mB");
  CHECK(escape_for_terminal("\xc2\x80\xc2\x9f\xc2\xa0") == "\\xc2\\x80\\xc2\\x9f\xc2\xa0");
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

TEST_CASE("generate: bytes escaped as they arrive print what escaping them at once prints") {
  // Random byte strings rich in UTF-8 lead and continuation bytes, fed one byte at a time (as
  // generate prints while it samples) and in random pieces.
  std::mt19937 gen(7);
  const unsigned char alphabet[] = {'a',  '\\', '\n', 0x01, 0x7f, 0x80, 0x82,
                                    0xa9, 0xbf, 0xc0, 0xc2, 0xc3, 0xe0, 0xe2,
                                    0xed, 0xf0, 0xf4, 0x9f, 0x90, 0xa0, 0xff};
  for (int round = 0; round < 2000; ++round) {
    std::string bytes;
    const int len = static_cast<int>(gen() % 12);
    for (int i = 0; i < len; ++i) bytes += static_cast<char>(alphabet[gen() % sizeof alphabet]);
    const std::string whole = escape_for_terminal(bytes);
    TerminalEscaper one;
    std::string by_byte;
    for (const char c : bytes) by_byte += one.push(std::string(1, c));
    by_byte += one.finish();
    CHECK(by_byte == whole);
    TerminalEscaper some;
    std::string by_piece;
    for (size_t i = 0; i < bytes.size();) {
      const size_t n = 1 + gen() % 3;
      by_piece += some.push(bytes.substr(i, n));
      i += n;
    }
    by_piece += some.finish();
    CHECK(by_piece == whole);
  }
  // A character split over two pushes waits for its last byte.
  TerminalEscaper e;
  CHECK(e.push("caf\xc3") == "caf");
  CHECK(e.push("\xa9!") == "\xc3\xa9!");
  CHECK(e.push("\xe2\x82") == "");
  CHECK(e.finish() == "\\xe2\\x82");
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
      {gpt + ck + " --temperature -0.5",
       "error: --temperature must be finite and >= 0 (0 = always the most likely byte; got -0.5)"},
      {gpt + ck + " --temperature inf", "error: --temperature must be finite and >= 0"},
      {gpt + ck + " --top-k 257", "error: --top-k must be in [0, 256] (0 = all bytes; got 257)"},
      {gpt + ck + " --top-k -1", "error: --top-k must be in [0, 256]"},
      {gpt + ck + " --seed -1", "error: --seed must be >= 0 (got -1)"},
      {gpt + ck, "error: checkpoint '" + t / "none" + "'"},
  };
  for (const Case& c : cases) {
    const CmdResult r = run_dtrain("generate " + c.args);
    INFO(c.args << "\n" << r.output);
    CHECK(r.exit_code == 2);
    CHECK(r.output.starts_with(c.message));
    CHECK(std::count(r.output.begin(), r.output.end(), '\n') == 1);
  }
  // validate expands the text patterns as run does: one that matches nothing is refused.
  for (const std::string set : {"data.train.path=nomatch*.txt", "data.test.path=nomatch*.txt"}) {
    const CmdResult r = run_dtrain("validate " + gpt + " --set " + set);
    INFO(set << "\n" << r.output);
    CHECK(r.exit_code == 2);
    CHECK(contains(r.output, "nomatch*.txt' matches no file"));
  }
  // Numbers in decimal only: CLI11 read 010 as octal 8 and 0x10 as 16, and took an empty value
  // as 0 (greedy sampling for `--temperature "$T"` with T unset). (A parse error adds a line
  // pointing at --help.)
  for (const std::string args :
       {" --tokens 010", " --seed 0x10", " --tokens ''", " --top-k 1.5", " --tokens 1e3"}) {
    const CmdResult r = run_dtrain("generate " + gpt + ck + args);
    INFO(args << "\n" << r.output);
    CHECK(r.exit_code == 2);
    CHECK(r.output.starts_with("error: --"));
    CHECK(contains(r.output, ": must be a decimal integer"));
  }
  for (const std::string args : {" --temperature ''", " --temperature 0x1"}) {
    const CmdResult r = run_dtrain("generate " + gpt + ck + args);
    INFO(args << "\n" << r.output);
    CHECK(r.exit_code == 2);
    CHECK(r.output.starts_with("error: --temperature: must be a decimal number"));
  }
  {  // a number past a double's range is named as such, not as a malformed number
    const CmdResult r = run_dtrain("generate " + gpt + ck + " --temperature 1e400");
    INFO(r.output);
    CHECK(r.exit_code == 2);
    CHECK(r.output.starts_with("error: --temperature: is out of a double's range"));
  }
  {  // and one below its smallest as too small, not as out of range
    const CmdResult r = run_dtrain("generate " + gpt + ck + " --temperature 1e-400");
    INFO(r.output);
    CHECK(r.exit_code == 2);
    CHECK(r.output.starts_with("error: --temperature: is too small for a double"));
  }
  // Integers past int64's range are refused, not clamped to its limit.
  for (const char* opt : {" --tokens ", " --top-k ", " --seed "}) {
    const CmdResult r = run_dtrain("generate " + gpt + ck + opt + "99999999999999999999");
    INFO(opt << "\n" << r.output);
    CHECK(r.exit_code == 2);
    CHECK(contains(r.output, "out of the integer range"));
  }
}

}  // namespace dtrain

namespace dtrain {

// The greedy continuation computed here: the model built for exactly the context's length (no
// padding), argmax of the last position, context cut to the last block_size bytes.
std::string greedy_reference(const std::string& cfg_path, const std::string& ck,
                             const std::string& prompt, int64_t tokens) {
  const Config cfg = load_config(cfg_path, {});
  const int64_t T = cfg.model.block_size;
  std::string seq = prompt, out = prompt;
  for (int64_t step = 0; step < tokens; ++step) {
    const int64_t len = std::min<int64_t>(T, static_cast<int64_t>(seq.size()));
    const Model m = build_model(cfg.model, {{len}, 256});
    std::vector<float> p(static_cast<size_t>(m.param_count()));
    load_checkpoint(resolve_checkpoint(ck, false), m, p.data(), {});
    Tensor x({1, len});
    for (int64_t t = 0; t < len; ++t)
      x[t] = static_cast<float>(static_cast<unsigned char>(seq[seq.size() - len + t]));
    Activations acts;
    const Tensor& y = m.forward(p.data(), x, acts, LayerCtx{false, nullptr});
    const float* last = y.data() + (len - 1) * 256;
    const int64_t next = std::max_element(last, last + 256) - last;
    seq += static_cast<char>(next);
    out += static_cast<char>(next);
  }
  return out;
}

TEST_CASE("generate: the prompt then --tokens bytes, reproducible per seed, greedy ignores it") {
  TempDir t;
  const std::string cfg = tiny_gpt(t);
  const std::string ck = train_tiny_gpt(t, cfg, 120);
  const std::string prompt = "the quick ";
  const std::string args = "--prompt '" + prompt + "' --tokens 40 --temperature 1.0 --top-k 20";
  const std::string a = generate_out(cfg, ck, args + " --seed 1");
  CHECK(a.starts_with(prompt));
  CHECK(unescape(a).size() == prompt.size() + 40);  // --tokens counts bytes, not characters
  CHECK(generate_out(cfg, ck, args + " --seed 1") == a);
  CHECK(generate_out(cfg, ck, args + " --seed 2") != a);
  // The config's seed when --seed is not given: seed 5.
  CHECK(generate_out(cfg, ck, args) == generate_out(cfg, ck, args + " --seed 5"));
  CHECK(unescape(generate_out(cfg, ck, "--prompt 'ab' --tokens 7 --seed 3")).size() == 9);
  CHECK(generate_out(cfg, ck, "--prompt '" + prompt + "' --tokens 0") == prompt);
  // Greedy: temperature 0 (any top-k) and top-k 1 (any temperature) are the argmax, whatever
  // the seed, and equal the continuation computed without generate's padding.
  const std::string g =
      generate_out(cfg, ck, "--prompt '" + prompt + "' --tokens 24 --temperature 0");
  CHECK(generate_out(cfg, ck, "--prompt '" + prompt + "' --tokens 24 --temperature 0 --seed 9") ==
        g);
  CHECK(generate_out(cfg, ck, "--prompt '" + prompt + "' --tokens 24 --top-k 1 --temperature 2") ==
        g);
  CHECK(unescape(g) == greedy_reference(cfg, ck, prompt, 24));
  // A prompt longer than block_size (16): the model sees its tail; the output starts with all of
  // it, and the context the model sees is the reference's.
  const std::string long_prompt = "the lazy dog. the quick brown fox ";
  const std::string lg =
      generate_out(cfg, ck, "--prompt '" + long_prompt + "' --tokens 5 --top-k 1");
  CHECK(unescape(lg) == greedy_reference(cfg, ck, long_prompt, 5));
  const CmdResult w = run_dtrain("generate " + cfg + " --checkpoint " + ck + " --prompt '" +
                                 long_prompt + "' --tokens 1");
  CHECK(contains(w.output, "the prompt has 34 bytes, more than model.block_size = 16"));
  // An output that fails (a full disk) stops the sampling with exit 1, not after N tokens.
  const CmdResult full = run_cmd("{ " + kBin + " generate " + cfg + " --checkpoint " + ck +
                                 " --tokens 100000000 > /dev/full; }");
  CHECK(full.exit_code == 1);
  CHECK_MESSAGE(contains(full.output, "generation stopped"), full.output);
}

TEST_CASE("eval with a test text reads it alone: a training text too short to train is no matter") {
  TempDir t;
  const std::string cfg = tiny_gpt(t);
  const std::string ck = train_tiny_gpt(t, cfg, 2);
  t.write("one.txt", "a");
  const std::string test = " --set data.test.path=" + t / "corpus.txt";
  const CmdResult whole = run_cmd(kBin + " eval " + cfg + " --checkpoint " + ck + test + " 2>&1");
  REQUIRE_MESSAGE(whole.exit_code == 0, whole.output);
  const CmdResult r = run_cmd(kBin + " eval " + cfg + " --checkpoint " + ck + test +
                              " --set data.train.path=" + t / "one.txt" + " 2>&1");
  CHECK_MESSAGE(r.exit_code == 0, r.output);  // (it was 'fewer than one window', exit 2)
  CHECK(r.output.substr(r.output.find('{')) == whole.output.substr(whole.output.find('{')));
}

TEST_CASE(
    "a checkpoint that does not fit the config: generate, eval and resume name what differs") {
  TempDir t;
  const std::string cfg = tiny_gpt(t);
  const std::string ck = train_tiny_gpt(t, cfg, 2);
  const std::string mlp_cfg = t.write(
      "mlp.yaml", "model: {hidden: [4]}\ndata: {format: synthetic}\ntrain: {max_steps: 1}\n");
  {
    const CmdResult r = run_dtrain("run " + mlp_cfg + " --out " + t / "mlp --log-level warn");
    REQUIRE(r.exit_code == 0);
  }
  const std::string mlp_ck = t / "mlp/checkpoints";
  struct Case {
    std::string cmd;
    std::vector<std::string> parts;  // each in the one line
  };
  const std::string gen = "generate " + cfg + " --checkpoint ";
  const std::string eval = "eval " + cfg + " --checkpoint ";
  const Case cases[] = {
      // The config the checkpoint stores is compared before the model is built: the keys that
      // differ are named. An MLP's checkpoint under the GPT config:
      {gen + mlp_ck, {"was trained with another model config", "model.type: \"mlp\" -> \"gpt\""}},
      // A GPT of another width, another depth, more positions than its wpe rows.
      {gen + ck + " --set model.n_embd=32", {"another model config", "model.n_embd: 16 -> 32"}},
      {gen + ck + " --set model.block_size=32", {"model.block_size: 16 -> 32"}},
      {gen + ck + " --set model.n_layer=2", {"model.n_layer: 1 -> 2"}},
      {eval + ck + " --set model.block_size=32", {"model.block_size: 16 -> 32"}},
      {"run " + cfg + " --out " + t / "run" +
           " --resume auto --log-level warn --set model.block_size=32",
       {"'transformer.wpe.weight' has shape [16, 16]", "expects [32, 16]"}},
  };
  for (const Case& c : cases) {
    const CmdResult r = run_dtrain(c.cmd);
    INFO(c.cmd << "\n" << r.output);
    CHECK(r.exit_code == 2);
    CHECK(r.output.starts_with("error: "));
    // One line, or the config comparison's list of keys, one per line.
    if (!contains(r.output, "another model config"))
      CHECK(std::count(r.output.begin(), r.output.end(), '\n') == 1);
    for (const std::string& part : c.parts) CHECK(contains(r.output, part));
    // Keys of the other model type are no difference (an mlp's model.hidden was listed).
    CHECK_FALSE(contains(r.output, "model.hidden"));
  }
  // Same shapes, another function: the stored config catches what the shapes cannot (n_head,
  // the GELU's place); dropout does not change what the weights compute and is accepted.
  for (const std::string& cmd :
       {gen + ck + " --set model.n_head=1 --tokens 4", eval + ck + " --set model.n_head=1"}) {
    const CmdResult r = run_dtrain(cmd);
    INFO(cmd << "\n" << r.output);
    CHECK(r.exit_code == 2);
    CHECK(contains(r.output, "was trained with another model config"));
    CHECK(contains(r.output, "model.n_head: 2 -> 1"));
  }
  {
    // A GPT's checkpoint under an image config: text is not normalised, so no data.normalize
    // line ("auto" (standardize) -> "auto" (scale) was listed).
    const CmdResult r =
        run_dtrain("eval " DTRAIN_SOURCE_DIR "/configs/fmnist_cnn.yaml --checkpoint " + ck);
    INFO(r.output);
    CHECK(r.exit_code == 2);
    CHECK(contains(r.output, "model.type: \"gpt\" -> \"sequential\""));
    CHECK_FALSE(contains(r.output, "data.normalize"));
  }
  const CmdResult ok = run_dtrain(eval + ck + " --set model.dropout=0.3");
  CHECK_MESSAGE(ok.exit_code == 0, ok.output);
  // A corrupt checkpoint is just that: neither the config hint (generate) nor the class-label
  // hint (eval; text data has no labels) is added to its message. (A weight's bytes: the
  // optimizer state, which these commands do not read, is not checked by them.)
  const std::string bad = t / "bad.safetensors";
  std::filesystem::copy_file(resolve_checkpoint(ck, false), bad);
  testing::flip_tensor_bit(bad, "transformer.h.0.mlp.c_fc.weight", 5);
  for (const std::string& cmd : {gen + bad + " --tokens 3", eval + bad}) {
    const CmdResult r = run_dtrain(cmd);
    INFO(cmd << "\n" << r.output);
    CHECK(r.exit_code == 2);
    CHECK(contains(r.output, "fails its CRC-32 check"));
    CHECK_FALSE(contains(r.output, "give the one it was trained with"));
    CHECK_FALSE(contains(r.output, "label"));
  }
}

}  // namespace dtrain

TEST_CASE(
    "eval and generate refuse differing tied copies, and resume names a missing optimizer state") {
  // A file without a stored config (as older ones are) whose lm_head.weight differs from
  // transformer.wte.weight: a tied model would read one of them and report numbers no model
  // computes (eval and generate exited 0; only --resume refused it).
  TempDir t;
  const std::string cfg_path = tiny_gpt(t);
  const dtrain::Config cfg = dtrain::load_config(cfg_path, {});
  const dtrain::Model model = dtrain::build_model(cfg.model, {{cfg.model.block_size}, 256});
  REQUIRE(model.ties().size() == 1);
  std::vector<float> params(static_cast<size_t>(model.param_count()));
  model.init(params.data(), 3);
  dtrain::CheckpointMeta meta;
  meta.optimizer = "adamw";
  const std::string same = t / "same.safetensors", differ = t / "differ.safetensors";
  dtrain::save_checkpoint(same, model, params.data(), {}, meta);
  const dtrain::ParamEntry& head = model.params()[model.ties()[0].mirror];
  params[static_cast<size_t>(head.offset)] += 0.5f;
  dtrain::save_checkpoint(differ, model, params.data(), {}, meta);
  for (const std::string& cmd : {"eval " + cfg_path + " --checkpoint ",
                                 "generate " + cfg_path + " --tokens 4 --checkpoint "}) {
    CmdResult r = run_dtrain(cmd + same + " --log-level warn");
    INFO(cmd << "\n" << r.output);
    CHECK(r.exit_code == 0);  // the same file with equal copies loads
    r = run_dtrain(cmd + differ + " --log-level warn");
    INFO(r.output);
    CHECK(r.exit_code == 2);
    CHECK(contains(r.output,
                   "lm_head.weight differs from transformer.wte.weight, so a model "
                   "with untied copies wrote it: give model.tie_embeddings: false"));
  }
  // The same file holds no optimizer state: a resume names that, not a momentum setting.
  const CmdResult r = run_dtrain("run " + cfg_path + " --out " + t / "resumed" + " --resume " +
                                 same + " --log-level warn");
  INFO(r.output);
  CHECK(r.exit_code == 2);
  CHECK(contains(r.output,
                 "holds no optimizer state (adamw keeps [exp_avg, exp_avg_sq]): a "
                 "weights-only file, which a resume cannot continue from"));
}

TEST_CASE("resume on a training text of another size warns that the order changed") {
  // The sampler's (epoch, batch) indexes the windows of the text it was saved with; a text cut
  // or grown since resumes into another order, which the log now says (it said nothing).
  TempDir t;
  const std::string cfg = tiny_gpt(t);
  const std::string ck = train_tiny_gpt(t, cfg, 3);
  const std::string warning = "the data changed since, so epoch 0 goes on from batch 3";
  CmdResult r = run_dtrain("run " + cfg + " --out " + t / "same" + " --resume " + ck +
                           " --log-level warn --set train.max_steps=4");
  INFO(r.output);
  CHECK(r.exit_code == 0);
  CHECK_FALSE(contains(r.output, warning));
  const std::string differs = "the training data differs from what";
  CHECK_FALSE(contains(r.output, differs));
  // As many bytes, other contents (a replaced file): said too (it went by in silence).
  std::string text = dtrain::testing::read_text(t / "corpus.txt");
  std::reverse(text.begin(), text.end());
  t.write("corpus.txt", text);
  r = run_dtrain("run " + cfg + " --out " + t / "other" + " --resume " + ck +
                 " --log-level warn --set train.max_steps=4");
  INFO(r.output);
  CHECK(r.exit_code == 0);
  CHECK(contains(r.output, differs));
  CHECK_FALSE(contains(r.output, warning));
  t.write("corpus.txt", std::string(4000, 'x'));
  r = run_dtrain("run " + cfg + " --out " + t / "cut" + " --resume " + ck +
                 " --log-level warn --set train.max_steps=4");
  INFO(r.output);
  CHECK(r.exit_code == 0);
  CHECK(contains(r.output, "the training set has 224 samples"));
  CHECK(contains(r.output, warning));
  // Cut below the batches done: the epoch is over, not resumed "from batch 3" of 3.
  t.write("corpus.txt", std::string(300, 'x'));
  r = run_dtrain("run " + cfg + " --out " + t / "short" + " --resume " + ck +
                 " --log-level warn --set train.max_steps=6 --set data.test_fraction=0");
  INFO(r.output);
  CHECK(r.exit_code == 0);
  CHECK(contains(r.output,
                 "so epoch 0 is over in the new set (its 3 batches are no more than the "
                 "3 done)\n"));
}

TEST_CASE("generate's error after the prompt is printed starts a line of its own") {
  // (weights that overflow the logits: "ab" and the error shared one line, "aberror: ...")
  TempDir t;
  const std::string cfg_path = tiny_gpt(t);
  const dtrain::Config cfg = dtrain::load_config(cfg_path, {});
  const dtrain::Model model = dtrain::build_model(cfg.model, {{cfg.model.block_size}, 256});
  std::vector<float> params(static_cast<size_t>(model.param_count()), 3e18f);
  dtrain::CheckpointMeta meta;
  meta.optimizer = "adamw";
  const std::string huge = t / "huge.safetensors";
  dtrain::save_checkpoint(huge, model, params.data(), {}, meta);
  const CmdResult r =
      run_dtrain("generate " + cfg_path + " --checkpoint " + huge + " --prompt ab --tokens 3");
  INFO(r.output);
  CHECK(r.exit_code != 0);
  CHECK(contains(r.output, "not finite"));
  CHECK_FALSE(contains(r.output, "aberror"));
}
