// Resource limits a user can run into: a model whose training state cannot fit, and more
// in-process ranks than the address space has room for threads. Both are one clear message and
// exit 2 before anything is trained, never std::bad_alloc or std::terminate.
#include <doctest/doctest.h>

#include <filesystem>
#include <string>
#include <vector>

#include <zlib.h>

#include "cli/cli_util.h"
#include "test_util.h"

using namespace dtrain::testing;

namespace {
const std::string kBin = DTRAIN_BIN;
const std::string kSrc = DTRAIN_SOURCE_DIR;
}  // namespace

TEST_CASE("a model too large for this machine's memory is refused before it is allocated") {
  TempDir dir;
  // The message names the keys that set the size, by model type.
  struct Case {
    std::string config, sets, keys;
  };
  for (const Case& c : {
           Case{"smoke.yaml", "--set 'model.hidden=[1000000000]'", "model.hidden"},
           Case{"lm_jargon.yaml", "--set model.n_embd=60000 --set model.n_head=1",
                "model.n_layer, n_embd, block_size"},
           Case{"fmnist_cnn.yaml",
                "--set 'model.layers=[flatten, {linear: 16777216}, {linear: 10}]'", "model.layers"},
       }) {
    // validate refuses it the same way, from the config and the data's headers.
    for (const std::string cmd : {"run", "validate"}) {
      const auto r = run_cmd(kBin + " " + cmd + " " + kSrc + "/configs/" + c.config + " " + c.sets +
                             (cmd == "run" ? " --out " + dir / "big" : "") + " 2>&1");
      const std::string what = cmd + ": " + r.output;
      INFO(what);
      CHECK(r.exit_code == 2);
      CHECK(contains(r.output, "parameters (" + c.keys + "): training needs about"));
      CHECK(contains(r.output, "GiB this process can allocate"));
      CHECK_FALSE(contains(r.output, "bad_alloc"));
    }
  }
}

TEST_CASE("a model whose activations cannot fit is refused before training, naming them") {
  TempDir dir;
  // 2,000 blocks of a tiny GPT: little training state, but each block keeps 33 [T, C] buffers
  // and the attention probabilities per sample (T 1024, C 16, 2 heads: ~10 MiB), so a batch of
  // 12 needs ~240 GiB. Before, the start-up check passed and the first step grew past the
  // machine's memory. (An evaluation batch of 8: smaller than the training batch's share.)
  const auto r = run_cmd(kBin + " run " + kSrc +
                         "/configs/lm_jargon.yaml --set model.n_layer=2000 --set model.n_embd=16 "
                         "--set model.n_head=2 --set model.block_size=1024 "
                         "--set data.eval_batch_size=8 --out " +
                         dir / "deep" + " 2>&1");
  INFO(r.output);
  CHECK(r.exit_code == 2);
  CHECK(contains(r.output,
                 "GiB for the activations of a batch of 12 (data.batch_size) of 1024 "
                 "positions each (model.block_size)"));
  CHECK(contains(r.output, "(model.n_layer, n_embd, block_size)"));
  CHECK(contains(r.output, "GiB this process can allocate"));
  CHECK_FALSE(contains(r.output, "step 1"));
}

TEST_CASE(
    "a convolution's im2col block that cannot fit is refused before --overwrite clears a run" *
    doctest::skip(kUnderSanitizer)) {
  // The check counted no work buffer: a 28x28 kernel padded by 800 passed it, --overwrite
  // deleted the old run, and the first forward's im2col block failed "out of memory". Padded by
  // 400: 4 samples x 784 x 801^2 floats, 8 GB, under an 8 GB address-space limit, so on any
  // machine.
  TempDir dir;
  const std::string run = kBin + " run " + kSrc + "/configs/fmnist_cnn.yaml --out " + dir / "old";
  const auto first =
      run_cmd(run + " --set train.epochs=0 --set train.max_steps=1 --no-eval --log-level warn");
  REQUIRE_MESSAGE(first.exit_code == 0, first.output);
  const std::string summary = read_text(dir / "old/summary.json");
  const auto r = run_cmd("ulimit -v 8000000 && " + run +
                         " --overwrite --set 'model.layers=[{conv2d: {out_channels: 1, kernel: 28, "
                         "padding: 400}}, {avg_pool2d: 801}, flatten, {linear: 10}]' --set "
                         "data.batch_size=4 2>&1");
  INFO(r.output);
  CHECK(r.exit_code == 2);
  CHECK(contains(r.output, "GiB this process can allocate"));
  CHECK(read_text(dir / "old/summary.json") == summary);
}

TEST_CASE("an evaluation batch whose activations cannot fit is refused before training") {
  TempDir dir;
  // 16 blocks of T 1024, C 256, 16 heads: an evaluation forward keeps every block's 16 [T, C]
  // tensors and its [16, T, T] probabilities, about 1.3 GiB per sample, so the evaluation batch
  // (data.eval_batch_size 256, or the 164 validation windows run finds) needs hundreds of GiB,
  // several times a training batch of 12. Before, training ran and the final evaluation failed
  // (or was killed), with no checkpoint written.
  const std::string sets =
      " --set model.n_layer=16 --set model.n_embd=256 --set model.n_head=16 "
      "--set model.block_size=1024";
  for (const std::string cmd : {"run", "validate"}) {
    const auto r = run_cmd(kBin + " " + cmd + " " + kSrc + "/configs/lm_jargon.yaml" + sets +
                           (cmd == "run" ? " --out " + dir / "wide" : "") + " 2>&1");
    const std::string what = cmd + ": " + r.output;
    INFO(what);
    CHECK(r.exit_code == 2);
    CHECK(contains(r.output, "GiB for the activations of an evaluation batch of "));
    CHECK(contains(r.output, "(data.eval_batch_size)"));
    // Training alone fits: the hint is the evaluation batch, and both batches are counted.
    CHECK(contains(r.output,
                   "GiB for the activations of a batch of 12 (data.batch_size) of 1024 "
                   "positions each (model.block_size) and "));
    CHECK(contains(r.output, "lower data.eval_batch_size"));
    CHECK_FALSE(contains(r.output, "step 1"));
  }
  // validate --no-eval checks what `run --no-eval` needs: the training batch alone, which fits.
  const auto r =
      run_cmd(kBin + " validate " + kSrc + "/configs/lm_jargon.yaml" + sets + " --no-eval 2>&1");
  INFO(r.output);
  CHECK(r.exit_code == 0);
  CHECK(contains(r.output, ": ok (config hash "));
}

TEST_CASE("a batch larger than the training set is estimated at the rows there are") {
  // 2^24 rows asked for, 3,200 there: the batch holds 3,200 (the estimate said 33 GiB before).
  TempDir dir;
  const auto r = run_cmd(kBin + " run " + kSrc +
                         "/configs/smoke.yaml --set data.batch_size=16777216 --set "
                         "train.max_steps=2 --out " +
                         dir / "b" + " 2>&1");
  INFO(r.output);
  CHECK(r.exit_code == 0);
  CHECK(contains(r.output, "done: "));
}

TEST_CASE("an address-space limit too small for OpenBLAS's buffers is refused, not spun on" *
          doctest::skip(kUnderSanitizer)) {
  // OpenBLAS maps a 128 MiB buffer per BLAS thread at its first call and retries a failed map
  // forever: under `ulimit -v` too low for it a run spun (SIGTERM ignored) instead of failing,
  // and even a refused run hung at exit, where OpenBLAS joins its worker threads.
  TempDir dir;
  for (const std::string limit : {"200000", "350000"}) {
    for (const std::string world : {"1", "4"}) {
      CAPTURE(limit);
      CAPTURE(world);
      const auto r = run_cmd("ulimit -v " + limit + "; timeout -k 5 60 " + kBin + " run " + kSrc +
                             "/configs/smoke.yaml --set distributed.world_size=" + world +
                             " --out " + dir / ("r" + limit + world) + " 2>&1");
      // Refused by the memory check (exit 2, naming the limit), or, when not even the rank
      // threads fit, by their start (exit 1, "cannot start 4 in-process ranks"); never a hang.
      CHECK_MESSAGE((r.exit_code == 2 || r.exit_code == 1), r.output);
      CHECK_MESSAGE((contains(r.output, "ulimit -v") ||
                     contains(r.output, "cannot start " + world + " in-process ranks")),
                    r.output);
    }
  }
  // With room, the same run trains.
  const auto r =
      run_cmd("ulimit -v 3000000; timeout -k 5 60 " + kBin + " run " + kSrc +
              "/configs/smoke.yaml --set train.max_steps=5 --out " + dir / "ok" + " 2>&1");
  CHECK_MESSAGE(r.exit_code == 0, r.output);
}

TEST_CASE(
    "eval and predict under an address-space limit too small for OpenBLAS: refused, not spun" *
    doctest::skip(kUnderSanitizer)) {
  // They checked the model and batch but not OpenBLAS's buffers: at 250 and 300 MB of address
  // space eval spun at OpenBLAS's first call until killed (measured; run was refused already).
  TempDir dir;
  const std::string cfg = kSrc + "/configs/smoke.yaml";
  auto r = run_cmd(kBin + " run " + cfg + " --set train.max_steps=2 --out " + dir / "r" +
                   " --log-level warn 2>&1");
  REQUIRE_MESSAGE(r.exit_code == 0, r.output);
  std::string row;
  for (int i = 0; i < 16; ++i) row += (i ? "," : "") + std::to_string(i % 5);
  const std::string in = dir.write("in.csv", row + "\n" + row + "\n");
  for (const std::string limit : {"250000", "300000"}) {
    for (const std::string& cmd : {"eval " + cfg + " --checkpoint " + dir / "r",
                                   "predict " + cfg + " --checkpoint " + dir / "r" + " --input " +
                                       in + " --output " + dir / "p.csv"}) {
      CAPTURE(limit);
      CAPTURE(cmd);
      r = run_cmd("ulimit -v " + limit + "; timeout -k 5 60 " + kBin + " " + cmd + " 2>&1");
      CHECK_MESSAGE(r.exit_code == 2, r.output);
      CHECK_MESSAGE(contains(r.output, "this process's address-space limit (ulimit -v: "),
                    r.output);
      CHECK_MESSAGE(contains(r.output,
                             "GiB evaluation needs: 0.00 GiB for the parameters and "
                             "the checkpoint's values as they load"),
                    r.output);
    }
  }
  // With room, the same evaluation runs.
  r = run_cmd("ulimit -v 3000000; " + kBin + " eval " + cfg + " --checkpoint " + dir / "r" +
              " 2>&1");
  CHECK_MESSAGE(r.exit_code == 0, r.output);
}

TEST_CASE("bench gemm --config and bench step refuse a model this process cannot hold, first" *
          doctest::skip(kUnderSanitizer)) {
  // They allocated it first: an allocation failure, or under overcommit a model touched into the
  // OOM killer; and under ulimit -v they spun in OpenBLAS as eval did.
  const std::string cfg = kSrc + "/configs/smoke.yaml";
  const std::string huge = " --set model.hidden=[600000000]";
  for (const std::string& cmd : {"bench gemm --config " + cfg + huge + " --iters 1",
                                 "bench step " + cfg + huge + " --steps 2 --block 1"}) {
    CAPTURE(cmd);
    const auto r = run_cmd("ulimit -v 3000000; timeout -k 5 60 " + kBin + " " + cmd + " 2>&1");
    CHECK(r.exit_code == 2);
    const std::string who = cmd.starts_with("bench gemm") ? "bench gemm --config" : "bench step";
    CHECK_MESSAGE(contains(r.output, "error: " + who + ": the config's step needs about "),
                  r.output);
    CHECK_MESSAGE(contains(r.output, " parameters and their gradients, "), r.output);
  }
  // (--threads 0, every core, spun: the probe was skipped for it)
  for (const std::string threads : {"1", "0"}) {
    const auto r = run_cmd("ulimit -v 300000; timeout -k 5 60 " + kBin + " bench gemm --config " +
                           cfg + " --iters 1 --threads " + threads + " 2>&1");
    CHECK(r.exit_code == 2);
    CHECK_MESSAGE(contains(r.output, "this process's address-space limit (ulimit -v: "), r.output);
    CHECK_MESSAGE(contains(r.output, "GiB the bench needs: "), r.output);
  }
}

TEST_CASE("bench gemm --widths and bench comm refuse buffers this process cannot hold, first" *
          doctest::skip(kUnderSanitizer)) {
  // They allocated (and filled) them: the OOM killer, or "out of memory ... use a smaller model
  // or data.batch_size", advice for a run.
  const std::vector<std::pair<std::string, std::string>> cases = {
      {"bench gemm --widths 16384,16384,16384 --iters 1", "bench gemm: --widths and --batch need "},
      {"bench comm --nproc 2 --sizes 1G --iters 1",
       "bench comm: 2 ranks need about 6.00 GiB to move 1073741824 bytes "},
      {"bench comm --backend grpc --nproc 2 --sizes 1G --iters 1",
       "bench comm: a rank needs about 3.00 GiB to move 1073741824 bytes "}};
  for (const auto& [cmd, want] : cases) {
    CAPTURE(cmd);
    const auto r = run_cmd("ulimit -v 3000000; timeout -k 5 60 " + kBin + " " + cmd + " 2>&1");
    CHECK(r.exit_code == 2);
    CHECK_MESSAGE(contains(r.output, "error: " + want), r.output);
  }
  // (a width past int64 was "not a whole number")
  const auto r = run_cmd(kBin + " bench gemm --widths 10,99999999999999999999 2>&1");
  CHECK(r.exit_code == 2);
  CHECK_MESSAGE(contains(r.output, "'99999999999999999999' is out of range"), r.output);
  // (an int option past its type was CLI11's "Could not convert: --width = 99999999999")
  const auto w = run_cmd(kBin + " plot runs/x -o p.svg --width 99999999999 2>&1");
  CHECK(w.exit_code == 2);
  CHECK_MESSAGE(contains(w.output, "error: --width 99999999999 is out of range for this option"),
                w.output);
}

TEST_CASE("huge timeouts mean a long wait: runs in-process and launched train, not time out") {
  TempDir dir;
  // Seconds past steady_clock's range wrapped to deadlines in the past: the first collective
  // (in-process), the rendezvous or the connect (gRPC) failed at once, exit 1.
  const std::string sets =
      " --set train.max_steps=2 --set distributed.timeout_s=1e10"
      " --set distributed.rendezvous_timeout_s=1e12 --set distributed.heartbeat_s=1e300"
      " --set train.preempt_save_timeout_s=1e10 --log-level warn";
  auto r = run_cmd(kBin + " run " + kSrc + "/configs/smoke.yaml --set distributed.world_size=2" +
                   sets + " --out " + dir / "inproc" + " 2>&1");
  INFO(r.output);
  CHECK(r.exit_code == 0);
  r = run_cmd(kBin + " launch --nproc 2 " + kSrc + "/configs/smoke.yaml" + sets + " --out " +
              dir / "grpc" + " 2>&1");
  INFO(r.output);
  CHECK(r.exit_code == 0);
  CHECK(contains(r.output, "after 2 steps"));
}

TEST_CASE("counts near 2^63 are counts, not overflows") {
  TempDir dir;
  // grad_accum_steps near 2^63: each epoch is one step (all its batches), as for any count above
  // the batches per epoch; it trained 0 steps with exit 0 (ceil(b / a) overflowed).
  auto r = run_cmd(kBin + " run " + kSrc +
                   "/configs/smoke.yaml --set train.max_steps=2 --set "
                   "train.grad_accum_steps=9223372036854775709 --log-level warn --out " +
                   dir / "accum" + " 2>&1");
  INFO(r.output);
  CHECK(r.exit_code == 0);
  CHECK(contains(r.output, "after 2 steps (2.00 epochs)"));
  // A PowerSGD rank near 2^62 compresses no matrix (rank (n + m) >= n m); it overflowed into an
  // internal vector::_M_default_append error, exit 1.
  r = run_cmd(kBin + " run " + kSrc +
              "/configs/smoke.yaml --set train.max_steps=2 --set "
              "distributed.compression.type=powersgd --set "
              "distributed.compression.rank=4611686018427387904 --log-level warn --out " +
              dir / "powersgd" + " 2>&1");
  INFO(r.output);
  CHECK(r.exit_code == 0);
  CHECK(contains(r.output, "after 2 steps"));
}

TEST_CASE("widths whose parameter count overflows int64 are refused, not wrapped negative") {
  TempDir dir;
  const auto r = run_cmd(kBin + " run " + kSrc +
                         "/configs/smoke.yaml --set 'model.hidden=[4000000000, 4000000000]' "
                         "--out " +
                         dir / "huge");
  INFO(r.output);
  CHECK(r.exit_code == 2);
  CHECK(contains(r.output, "[4000000000, 4000000000] has more than 2^40 values"));
  CHECK_FALSE(contains(r.output, "max_size"));
}

TEST_CASE("more in-process ranks than threads fit in the address space: exit 1, no abort" *
          doctest::skip(kUnderSanitizer)) {
  TempDir dir;
  // 4 GB of address space hold a few hundred 8 MiB thread stacks, not 1024.
  const auto r = run_cmd("bash -c 'ulimit -v 4000000; " + kBin + " run " + kSrc +
                         "/configs/smoke.yaml --set distributed.world_size=1024 --out " +
                         dir / "many" + " --log-level warn' 2>&1");
  INFO(r.output);
  CHECK(r.exit_code == 1);  // a runtime failure: the same config runs where more threads fit
  CHECK(contains(r.output, "error: cannot start 1024 in-process ranks"));
  CHECK_FALSE(contains(r.output, "terminate called"));
  // bench comm's in-process ranks too (they aborted: exit 134, "terminate called").
  const auto b = run_cmd("bash -c 'ulimit -v 4000000; " + kBin +
                         " bench comm --sizes 4 --nproc 1024 --iters 1' 2>&1");
  INFO(b.output);
  CHECK(b.exit_code == 1);
  CHECK(contains(b.output, "error: cannot start 1024 in-process ranks"));
  CHECK(contains(b.output, "lower --nproc"));
  CHECK_FALSE(contains(b.output, "terminate called"));
}

TEST_CASE("dtrain launch stops a SIGSTOPped rank without waiting out its grace period") {
  TempDir dir;
  const std::string cfg = dir.write("long.yaml", R"(seed: 3
model: {hidden: [64]}
data:
  format: synthetic
  synthetic: {samples: 20000, features: 16, classes: 4}
  batch_size: 16
optimizer: {type: sgd, lr: 0.05}
train: {epochs: 50, log_every: 50}
distributed: {backend: grpc, world_size: 2, timeout_s: 60, heartbeat_s: 1}
runtime: {threads: 1}
)");
  // Rank 1 (found by its RANK in /proc) is stopped once training is under way. Rank 0 notices
  // the missing heartbeats and fails; the launcher then stops rank 1: SIGTERM, which a stopped
  // process acts on only when continued, so the launcher continues it too. Before, the stopped
  // rank sat out the launcher's whole 10 s grace and was SIGKILLed.
  const std::string script =
      "set -u; " + kBin + " launch --nproc 2 " + cfg + " --out " + dir / "run" + " > " +
      dir / "launch.log 2>&1 & L=$!; for i in $(seq 600); do [ -s " + dir / "run/metrics.jsonl" +
      " ] && break; sleep 0.1; done; for p in $(pgrep -P $L); do "
      "tr \"\\0\" \"\\n\" < /proc/$p/environ | grep -qx RANK=1 && kill -STOP $p; done; "
      "start=$(date +%s%N); wait $L; rc=$?; "
      "echo launch_exit=$rc elapsed_ms=$(( ($(date +%s%N) - start) / 1000000 ))";
  const auto r = run_cmd("bash -c '" + script + "'");
  INFO(r.output, read_text(dir / "launch.log"));
  CHECK_FALSE(contains(r.output, "launch_exit=0"));
  const size_t at = r.output.find("elapsed_ms=");
  REQUIRE(at != std::string::npos);
  CHECK(std::stol(r.output.substr(at + 11)) < 8000);  // heartbeat 1 s + shutdown; grace is 10 s
  const std::string log = read_text(dir / "launch.log");
  CHECK_FALSE(contains(log, "sending SIGKILL"));
  // The launcher names the stopped rank as the cause, not rank 0, which failed first waiting
  // for it.
  CHECK(contains(log, "rank 1 is stopped (process state T"));
  CHECK(contains(log, "launch failed: rank 1 was stopped (process state T)"));
}

TEST_CASE("an --out path that is not UTF-8 is refused before training") {
  TempDir dir;
  // $'\xff' in bash: a byte that is never valid UTF-8.
  const auto r = run_cmd("bash -c \"" + kBin + " run " + kSrc + "/configs/smoke.yaml --out " +
                         dir.path() + "/bad\\$'\\xff'\" 2>&1");
  INFO(r.output);
  CHECK(r.exit_code == 2);
  CHECK(contains(r.output, "the path is not valid UTF-8"));
  CHECK_FALSE(std::filesystem::exists(dir / "bad\xff"));
}

TEST_CASE("training data that overflows float32 is named as the cause, not the learning rate") {
  // Values near float32's limit with data.normalize none: the loss of step 1, before any
  // update, is not finite. The message blamed optimizer.lr. Exit 2: no restart changes it (it
  // was 1, which a launcher restarts).
  TempDir dir;
  std::string csv = "a,b,label\n";
  for (int i = 0; i < 40; ++i)
    csv += (i % 2 ? "3e38,1," : "-3e38,2,") + std::to_string(i % 2) + "\n";
  const std::string data = dir.write("d.csv", csv);
  const std::string cfg =
      dir.write("c.yaml", "model: {hidden: [8]}\ndata: {format: csv, train: {path: " + data +
                              "}, normalize: none, batch_size: 8}\noptimizer: {type: sgd, lr: "
                              "0.1}\ntrain: {max_steps: 2}\nruntime: {threads: 1}\n");
  const auto r = run_cmd(kBin + " run " + cfg + " --out " + dir / "r" + " 2>&1");
  INFO(r.output);
  CHECK(r.exit_code == 2);
  CHECK(contains(r.output, "not finite at step 1, before any update"));
  CHECK_FALSE(contains(r.output, "lower optimizer.lr"));
}

TEST_CASE("a checkpoint whose weights overflow is named as the cause on resume, exit 2") {
  // A run with train.nonfinite: skip and a huge rate saves weights that overflow; the first step
  // of a run resuming them is not finite before it updates anything, as a restart's would be. It
  // exited 1 (a launcher restarted it) and advised lowering the rate, which had not acted.
  TempDir dir;
  const std::string cfg = dir.write(
      "c.yaml",
      "model: {hidden: [8]}\ndata: {format: synthetic, synthetic: {samples: 64, features: 4, "
      "classes: 2}, batch_size: 8}\noptimizer: {type: sgd, lr: 0.1}\ntrain: {max_steps: 8}\n"
      "runtime: {threads: 1}\n");
  auto r = run_cmd(kBin + " run " + cfg + " --out " + dir / "a" +
                   " --set train.nonfinite=skip --set optimizer.lr=1e30 2>&1");
  REQUIRE_MESSAGE(r.exit_code == 0, r.output);
  r = run_cmd(kBin + " run " + cfg + " --out " + dir / "b" + " --resume " + dir / "a" +
              " --set train.max_steps=12 --set optimizer.lr=0.001 2>&1");
  INFO(r.output);
  CHECK(r.exit_code == 2);
  CHECK(contains(r.output,
                 "is not finite at step 9, the first after resuming, before this run "
                 "updated anything: the checkpoint '"));
  CHECK_FALSE(contains(r.output, "lower optimizer.lr"));
}

TEST_CASE("a NaN injected at step 1 is named as such, exit 1 (a restart clears it)") {
  TempDir dir;
  const std::string cfg = dir.write(
      "c.yaml",
      "model: {hidden: [8]}\ndata: {format: synthetic, synthetic: {samples: 64, features: 4, "
      "classes: 2}, batch_size: 8}\ntrain: {max_steps: 2}\nruntime: {threads: 1}\n");
  const auto r = run_cmd("DTRAIN_FAULT=nan:rank=0:step=1 " + kBin + " run " + cfg + " --out " +
                         dir / "r" + " 2>&1");
  INFO(r.output);
  CHECK(r.exit_code == 1);
  CHECK(contains(r.output, "is not finite at step 1: DTRAIN_FAULT injected a NaN there"));
  CHECK_FALSE(contains(r.output, "training data"));
}

TEST_CASE("in-process pipeline stages of different sizes are counted each at its own size" *
          doctest::skip(kUnderSanitizer)) {
  // Two stages of an mlp [6000, 6000] with AdamW: stage 0 holds 0.1 M parameters, stage 1 the
  // 36 M of the middle layer. The process holds both ranks: 0.54 GiB of state, which fits in
  // 1.4 GB of address space. Each rank counted its own stage twice (every in-process rank as
  // large as itself), so the large stage's rank refused for 1.08 GiB while the other did not.
  TempDir dir;
  const std::string cfg = dir.write("two.yaml", R"(seed: 7
model: {hidden: [6000, 6000]}
data: {format: synthetic, synthetic: {samples: 250, features: 16, classes: 8}, batch_size: 24}
optimizer: {type: adamw, lr: 0.01}
train: {max_steps: 2}
distributed: {backend: inproc, world_size: 2, pipeline: {stages: 2}}
runtime: {threads: 1}
)");
  auto r = run_cmd("bash -c 'ulimit -v 1400000; " + kBin + " validate " + cfg + "' 2>&1");
  INFO(r.output);
  CHECK(r.exit_code == 0);
  // Two data-parallel ranks each hold the whole model: 1.08 GiB, refused.
  r = run_cmd("bash -c 'ulimit -v 1400000; " + kBin + " validate " + cfg +
              " --set distributed.pipeline.stages=1' 2>&1");
  INFO(r.output);
  CHECK(r.exit_code == 2);
  CHECK(contains(r.output, "1.08 GiB for parameters, gradients and optimizer state"));
}

TEST_CASE(
    "checkpoint consolidate past what it can allocate says what it holds, not training advice" *
    doctest::skip(kUnderSanitizer)) {
  // Out of memory, it ended with the generic "use a smaller model or data.batch_size, or more
  // ranks", advice for training, no help to a conversion.
  TempDir dir;
  const std::string cfg = dir.write(
      "c.yaml",
      "seed: 1\nmodel: {type: mlp, hidden: [4096, 4096, 2048]}\n"
      "data: {format: synthetic, synthetic: {samples: 64, features: 784, classes: 10}, "
      "batch_size: 8}\noptimizer: {type: sgd, lr: 0.01, momentum: 0.9}\ntrain: {max_steps: 1}\n"
      "distributed: {backend: inproc, world_size: 2, strategy: fsdp}\nruntime: {threads: 1}\n");
  auto r = run_cmd(kBin + " run " + cfg + " --out " + dir / "r" + " --log-level warn");
  REQUIRE_MESSAGE(r.exit_code == 0, r.output);
  const std::string consolidate = kBin + " checkpoint consolidate " + dir / "r/checkpoints/step-1" +
                                  " -o " + dir / "one.safetensors";
  // 217 MB of shards: consolidating takes over 400 MB of address space; dtrain starts in 100.
  r = run_cmd("ulimit -v 250000 && " + consolidate);
  CHECK(r.exit_code == 2);
  CHECK_MESSAGE(contains(r.output,
                         "holds the whole model's parameters and optimizer state in "
                         "memory at once (its shards take 2"),
                r.output);
  CHECK_FALSE(contains(r.output, "data.batch_size"));
  r = run_cmd(consolidate);
  CHECK_MESSAGE(r.exit_code == 0, r.output);
}

TEST_CASE("a gzip text file of several members larger than 4 MB reads within its size" *
          doctest::skip(kUnderSanitizer)) {
  // A trailer's ISIZE is its last member's length: a rule that trusted it for files of 4 GiB or
  // more took two members of 2.2 MB each for a 4 GiB file and zero-filled 4.25 GB (refused
  // under a 2 GB address-space limit, "inflate to more than ...").
  TempDir dir;
  const std::string gz = dir / "two.txt.gz";
  std::vector<char> bytes(2200000);
  uint32_t x = 12345;
  for (char& c : bytes) c = static_cast<char>((x = x * 1664525u + 1013904223u) >> 24);
  for (const char* mode : {"wb1", "ab1"}) {  // "a": a second gzip member
    gzFile f = gzopen(gz.c_str(), mode);
    REQUIRE(f != nullptr);
    REQUIRE(gzwrite(f, bytes.data(), static_cast<unsigned>(bytes.size())) > 0);
    REQUIRE(gzclose(f) == Z_OK);
  }
  REQUIRE(std::filesystem::file_size(gz) > 4161834);  // (past the 1032:1 bound's 4 GiB)
  const std::string cfg = dir.write(
      "g.yaml",
      "model: {type: gpt, n_layer: 1, n_head: 1, n_embd: 8, block_size: 8}\n"
      "data: {format: text, train: {path: " +
          gz +
          "}, batch_size: 4, eval_batch_size: 64}\n"
          "optimizer: {type: sgd, lr: 0.01}\ntrain: {max_steps: 1}\nruntime: {threads: 1}\n");
  const auto r = run_cmd("ulimit -v 2000000 && " + kBin + " run " + cfg + " --out " + dir / "r" +
                         " --log-level warn --no-progress");
  CHECK_MESSAGE(r.exit_code == 0, r.output);
  CHECK_MESSAGE(contains(r.output, "done: "), r.output);
}

TEST_CASE("IDX images that cannot fit as float32 inputs are refused from their header" *
          doctest::skip(kUnderSanitizer)) {
  // A gzip file holding only a header that claims 3,000,000 images of 28x28: 2.2 GB read and
  // 9 GB as float32 inputs, under a 3 GB address-space limit. Before, run inflated what it could
  // and failed with a bare out-of-memory, or (this file) said the data was short of its header.
  TempDir dir;
  const std::string img = dir / "img.gz", lab = dir / "lab.gz";
  auto write_gz = [](const std::string& path, const std::string& bytes) {
    gzFile f = gzopen(path.c_str(), "wb1");
    REQUIRE(f != nullptr);
    REQUIRE(gzwrite(f, bytes.data(), static_cast<unsigned>(bytes.size())) > 0);
    REQUIRE(gzclose(f) == Z_OK);
  };
  write_gz(img, be32(0x803) + be32(3000000) + be32(28) + be32(28));
  write_gz(lab, be32(0x801) + be32(3000000) + std::string(1000, '\0'));
  const std::string cfg = dir.write(
      "i.yaml", "model: {type: mlp, hidden: [8]}\ndata: {format: idx, train: {images: " + img +
                    ", labels: " + lab +
                    "}, batch_size: 8}\noptimizer: {type: sgd, lr: 0.01}\ntrain: {max_steps: 1}\n");
  for (const std::string cmd : {"run", "validate"}) {
    const auto r = run_cmd("ulimit -v 3000000 && " + kBin + " " + cmd + " " + cfg +
                           (cmd == "run" ? " --out " + dir / "r" : "") + " 2>&1");
    const std::string what = cmd + ": " + r.output;
    INFO(what);
    CHECK(r.exit_code == 2);
    CHECK(contains(r.output, "cannot load IDX images file '" + img +
                                 "': its 3000000 images of 28x28 pixels need 2243 MiB read and "
                                 "8972 MiB as float32 inputs, more than the "));
  }
}

TEST_CASE("predict --input - stops reading a standard input larger than it could hold" *
          doctest::skip(kUnderSanitizer)) {
  // /dev/zero (or `yes 1,2 | ...`) grew without end, past any memory limit, to the generic
  // out-of-memory advice (a smaller model or batch) or the OOM killer.
  TempDir dir;
  const std::string cfg = kSrc + "/configs/smoke.yaml";
  REQUIRE(run_cmd(kBin + " run " + cfg + " --out " + dir / "r" +
                  " --set train.max_steps=5 --log-level warn")
              .exit_code == 0);
  const auto r =
      run_cmd("ulimit -v 2000000; timeout -k 5 120 " + kBin + " predict " + cfg + " --checkpoint " +
              dir / "r" + " --input - --output " + dir / "p.csv" + " < /dev/zero");
  CHECK(r.exit_code == 2);
  CHECK_MESSAGE(contains(r.output, "error: cannot read '<stdin>': its first "), r.output);
  CHECK(contains(r.output, "this process can allocate"));
  CHECK_FALSE(std::filesystem::exists(dir / "p.csv"));
}
