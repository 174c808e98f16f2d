// Safe interrupts through the real binary: the first SIGINT/SIGTERM makes every rank finish its
// step, agree on it, checkpoint, write summary.json "interrupted" and exit 130 (SIGINT) or 75
// (SIGTERM, train.preempt_signal's default: a preemption; `dtrain launch` passes its ranks' code
// through); a second
// signal ends the process at once; `--resume auto` then ends bitwise equal to a run that was
// never interrupted. Also the protected output folder (refused, --overwrite, --resume auto).
#include <doctest/doctest.h>

#include <signal.h>

#include <algorithm>
#include <chrono>
#include <filesystem>
#include <sstream>
#include <string>
#include <thread>
#include <tuple>
#include <vector>

#include <nlohmann/json.hpp>

#include "cli/cli_util.h"
#include "launch/launcher.h"
#include "test_util.h"
#include "util/interrupt.h"

using dtrain::testing::Child;
using dtrain::testing::contains;
using dtrain::testing::read_text;
using dtrain::testing::run_cmd;
using dtrain::testing::TempDir;
using dtrain::testing::wait_until;

namespace {

const std::string kBin = DTRAIN_BIN;

// 3000 short steps with dropout (the RNG must resume too) and momentum; every_steps 0, so the
// only checkpoints are the interrupt's and the final one.
const char* kCfg = R"(seed: 5
model: {hidden: [32, 32], dropout: 0.1}
data:
  format: synthetic
  synthetic: {samples: 3000, features: 12, classes: 4, noise: 0.6}
  batch_size: 16
optimizer: {type: sgd, lr: 0.05, momentum: 0.9, schedule: {type: cosine}}
train: {epochs: 0, max_steps: 3000, log_every: 10, checkpoint: {every_steps: 0, keep_last: 2}}
runtime: {threads: 1}
)";

size_t lines_in(const std::string& path) {
  const std::string t = read_text(path);
  return static_cast<size_t>(std::count(t.begin(), t.end(), '\n'));
}

// Interrupts `dtrain <verb> CFG <args> --out DIR` with `sig` once it has logged a few records,
// checks what it left, resumes it, and compares with the uninterrupted run.
void interrupt_and_resume(const std::string& verb, const std::string& args, int sig,
                          int64_t step_multiple = 1) {
  TempDir dir;
  const std::string cfg = dir.write("cfg.yaml", kCfg);
  const std::string ref = dir / "ref", cut = dir / "cut";
  const auto r0 =
      run_cmd(kBin + " " + verb + " " + cfg + " " + args + " --out " + ref + " --log-level warn");
  REQUIRE_MESSAGE(r0.exit_code == 0, r0.output);

  // The interrupted run sleeps 3 ms a step (DTRAIN_FAULT delay: timing only, same numbers), so
  // it is surely mid-run when the signal comes.
  Child c("DTRAIN_FAULT=delay:rank=0:ms=3 exec " + kBin + " " + verb + " " + cfg + " " + args +
              " --out " + cut + (verb == "run" ? " --no-progress" : ""),
          dir / "cut.log");
  REQUIRE(wait_until([&] { return lines_in(cut + "/metrics.jsonl") >= 3; }, 60));
  const auto t0 = std::chrono::steady_clock::now();
  c.signal(sig);
  const int rc = c.wait(60);
  const double took = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  const std::string log = read_text(dir / "cut.log");
  // SIGTERM is the default preemption signal: dtrain run exits kExitPreempted (75).
  const bool preempted = sig == SIGTERM;
  REQUIRE_MESSAGE(rc == (preempted ? 75 : 128 + sig), log);  // dtrain launch passes it through
  CHECK_FALSE(c.signaled());  // it exited on its own, with the signal's code
  CHECK_MESSAGE(took < 20.0, took);

  const auto s = nlohmann::json::parse(read_text(cut + "/summary.json"));
  CHECK(s["status"] == "interrupted");
  CHECK(s["interrupted_by"] == (sig == SIGINT ? "SIGINT" : "SIGTERM"));
  CHECK(s["preempted"] == preempted);
  const int64_t step = s["steps"].get<int64_t>();
  CHECK(step > 0);
  CHECK(step < 3000);
  CHECK(step % step_multiple == 0);
  std::string latest = read_text(cut + "/checkpoints/latest");
  CHECK_MESSAGE(contains(latest, "step-" + std::to_string(step)), latest);
  CHECK_MESSAGE(contains(log, std::string(preempted ? "preempted" : "interrupted") + " at step " +
                                  std::to_string(step)),
                log);
  CHECK(contains(log, "continue with --resume auto"));
  // The signal is acknowledged before the loop says which step it stops after (the two came in
  // either order).
  const size_t received = log.find("received SIG"), stopping = log.find(": stopping after step");
  CHECK_MESSAGE(received < stopping, log);

  const auto r1 = run_cmd(kBin + " " + verb + " " + cfg + " " + args + " --out " + cut +
                          " --resume auto --log-level warn");
  REQUIRE_MESSAGE(r1.exit_code == 0, r1.output);
  const auto s1 = nlohmann::json::parse(read_text(cut + "/summary.json"));
  CHECK(s1["status"] == "completed");
  CHECK(s1["steps"] == 3000);
  CHECK(s1["steps_this_run"] == 3000 - step);
  dtrain::testing::check_same_state(dtrain::testing::latest_run_state(kBin, ref),
                                    dtrain::testing::latest_run_state(kBin, cut),
                                    verb + " " + args);
}

}  // namespace

TEST_CASE("SIGINT to a 1-rank run checkpoints at the current step, exits 130, resumes bitwise") {
  interrupt_and_resume("run", "", SIGINT);
}

TEST_CASE("SIGTERM to 3 in-process ddp ranks: one agreed step, exit 75, bitwise resume") {
  interrupt_and_resume("run", "--set distributed.world_size=3", SIGTERM);
}

TEST_CASE("SIGINT to 3 in-process fsdp ranks writes a sharded checkpoint, bitwise resume") {
  interrupt_and_resume("run", "--set distributed.world_size=3 --set distributed.strategy=fsdp",
                       SIGINT);
}

TEST_CASE("SIGTERM to a 2-stage pipeline of in-process ranks: exit 75, bitwise resume") {
  interrupt_and_resume("run",
                       "--set distributed.world_size=2 --set distributed.strategy=pipeline "
                       "--set distributed.pipeline.stages=2",
                       SIGTERM);
}

TEST_CASE("SIGTERM to 2 in-process Local SGD ranks stops at a synchronisation, bitwise resume") {
  interrupt_and_resume("run",
                       "--set distributed.world_size=2 --set distributed.strategy=local_sgd "
                       "--set distributed.local_sgd.sync_every=8 "
                       "--set distributed.local_sgd.sync_optimizer_state=true",
                       SIGTERM, 8);
}

TEST_CASE("SIGTERM to dtrain launch (2 Local SGD ranks, each its own momentum): bitwise resume") {
  // The checkpoint holds rank 1's momentum too (replica.rank1.momentum), sent over gRPC both ways.
  interrupt_and_resume("launch",
                       "--nproc 2 --set distributed.strategy=local_sgd "
                       "--set distributed.local_sgd.sync_every=8",
                       SIGTERM, 8);
}

TEST_CASE("SIGINT to dtrain launch (2 ranks over gRPC): the ranks checkpoint, launch exits 130") {
  interrupt_and_resume("launch", "--nproc 2", SIGINT);
}

TEST_CASE("SIGTERM to dtrain launch (2 fsdp ranks over gRPC) exits 75, bitwise resume") {
  interrupt_and_resume("launch", "--nproc 2 --set distributed.strategy=fsdp", SIGTERM);
}

TEST_CASE("a second SIGINT ends the run at once, by the signal") {
  TempDir dir;
  const std::string cfg = dir.write("cfg.yaml", kCfg);
  Child c("DTRAIN_FAULT=delay:rank=0:ms=5000 exec " + kBin + " run " + cfg + " --out " +
              dir / "run" + " --no-progress --set train.log_every=1",
          dir / "log");
  REQUIRE(wait_until([&] { return lines_in(dir / "run/metrics.jsonl") >= 1; }, 60));
  // The step in progress sleeps 5 s: the second comes well before its end, and well after the
  // second in which another signal is the same request (delivered twice).
  c.signal(SIGINT);
  std::this_thread::sleep_for(std::chrono::milliseconds(2000));
  c.signal(SIGINT);
  const int rc = c.wait(20);
  CHECK(rc == 128 + SIGINT);
  CHECK(c.signaled());
  CHECK_FALSE(std::filesystem::exists(dir / "run/summary.json"));
}

TEST_CASE("a script's background run stops on Ctrl-C, also with the script's SIGTERM after it") {
  // A non-interactive shell starts `dtrain run ... &` with SIGINT ignored: a Ctrl-C at the
  // terminal ended the script and left the run training. And a script that traps the Ctrl-C and
  // sends its ranks SIGTERM made that copy a second signal: the run ended without a checkpoint.
  TempDir dir;
  const std::string cfg = dir.write("cfg.yaml", kCfg);
  Child c("trap '' INT; DTRAIN_FAULT=delay:rank=0:ms=3 exec " + kBin + " run " + cfg + " --out " +
              dir / "run" + " --no-progress",
          dir / "log");
  REQUIRE(wait_until([&] { return lines_in(dir / "run/metrics.jsonl") >= 2; }, 60));
  c.signal(SIGINT);
  std::this_thread::sleep_for(std::chrono::milliseconds(100));
  c.signal(SIGTERM);
  const int rc = c.wait(30);
  const std::string log = read_text(dir / "log");
  CHECK_MESSAGE(rc == 128 + SIGINT, log);
  CHECK_FALSE(c.signaled());
  const auto s = nlohmann::json::parse(read_text(dir / "run/summary.json"));
  CHECK(s["status"] == "interrupted");
  CHECK(s["interrupted_by"] == "SIGINT");
  CHECK(contains(read_text(dir / "run/checkpoints/latest"),
                 "step-" + std::to_string(s["steps"].get<int64_t>())));
}

TEST_CASE("a config.json that no dtrain run wrote is neither replaced nor deleted") {
  // config.json is a common name (a model's, a project's): it was replaced by the run's own.
  TempDir dir;
  const std::string cfg = dir.write("cfg.yaml", kCfg);
  std::filesystem::create_directories(dir / "proj");
  const std::string mine = dir.write("proj/config.json", "{\"my\": \"precious settings\"}\n");
  for (const std::string extra : {"", " --overwrite"}) {
    const auto r =
        run_cmd(kBin + " run " + cfg + " --set train.max_steps=2 --out " + dir / "proj" + extra);
    INFO(extra << "\n" << r.output);
    CHECK(r.exit_code == 2);
    CHECK(contains(r.output, "holds a config.json that no dtrain run wrote"));
    CHECK(read_text(mine) == "{\"my\": \"precious settings\"}\n");
  }
  // The config.json of a run that failed before training is the run's: a new run goes ahead.
  const std::string out = dir / "failed";
  auto r =
      run_cmd(kBin + " run " + cfg + " --set train.max_steps=2 --out " + out + " --log-level warn");
  REQUIRE_MESSAGE(r.exit_code == 0, r.output);
  std::filesystem::remove_all(out + "/checkpoints");
  std::filesystem::remove(out + "/summary.json");
  std::filesystem::remove(out + "/metrics.jsonl");
  r = run_cmd(kBin + " run " + cfg + " --set train.max_steps=2 --out " + out + " --log-level warn");
  CHECK_MESSAGE(r.exit_code == 0, r.output);
}

TEST_CASE("--overwrite clears a checkpoints/ folder linked to another disk and keeps the link") {
  // (it removed the link: the new run wrote beside the old one's files, on the small disk, and
  // the old checkpoints stayed on the large one)
  TempDir dir;
  const std::string cfg = dir.write("cfg.yaml", kCfg);
  const std::string out = dir / "out";
  const std::string disk = dir / "disk/ck";
  std::filesystem::create_directories(disk);
  std::filesystem::create_directories(out);
  std::filesystem::create_directory_symlink(disk, out + "/checkpoints");
  const std::string base =
      kBin + " run " + cfg + " --set train.checkpoint.every_steps=10 --log-level warn --out " + out;
  auto r = run_cmd(base + " --set train.max_steps=30");
  REQUIRE_MESSAGE(r.exit_code == 0, r.output);
  REQUIRE(std::filesystem::exists(disk + "/step-30.safetensors"));
  // The linked folder is checked as the folder itself: a file of the user's there is refused.
  dir.write("disk/ck/notes.txt", "mine");
  r = run_cmd(base + " --set train.max_steps=20 --overwrite");
  CHECK(r.exit_code == 2);
  CHECK_MESSAGE(contains(r.output, "holds what no dtrain run wrote ('notes.txt')"), r.output);
  std::filesystem::remove(disk + "/notes.txt");
  r = run_cmd(base + " --set train.max_steps=20 --overwrite");
  REQUIRE_MESSAGE(r.exit_code == 0, r.output);
  CHECK(std::filesystem::is_symlink(out + "/checkpoints"));
  CHECK(std::filesystem::exists(disk + "/step-20.safetensors"));
  CHECK_FALSE(std::filesystem::exists(disk + "/step-30.safetensors"));
  CHECK(read_text(disk + "/latest") == "step-20.safetensors\n");
  // A link whose target is gone (a disk not mounted): refused, the link kept (--overwrite made
  // a folder in its place).
  std::filesystem::remove_all(dir / "disk");
  r = run_cmd(base + " --set train.max_steps=20 --overwrite");
  CHECK(r.exit_code == 2);
  CHECK_MESSAGE(contains(r.output, "which does not exist (a disk not mounted?)"), r.output);
  CHECK(std::filesystem::is_symlink(out + "/checkpoints"));
}

TEST_CASE("a run whose checkpoints/ links to a running run's checkpoints folder is refused") {
  // (the folder lock covered --out only: the second run's --overwrite emptied the first's
  // checkpoints while it trained, and its start's cleanup took a save in progress)
  TempDir dir;
  const std::string cfg = dir.write("cfg.yaml", kCfg);
  const std::string a = dir / "a", b = dir / "b";
  Child c("DTRAIN_FAULT=delay:rank=0:ms=20 exec " + kBin + " run " + cfg + " --out " + a +
              " --no-progress --set train.checkpoint.every_steps=10",
          dir / "a.log");
  REQUIRE(wait_until([&] { return std::filesystem::exists(a + "/checkpoints/latest"); }, 60));
  std::filesystem::create_directories(b);
  std::filesystem::create_directory_symlink(a + "/checkpoints", b + "/checkpoints");
  for (const std::string extra : {" --overwrite", " --resume auto"}) {
    const auto r =
        run_cmd(kBin + " run " + cfg + " --out " + b + " --set train.max_steps=5" + extra);
    INFO(extra << "\n" << r.output);
    CHECK(r.exit_code == 2);
    CHECK(contains(r.output, "is in use by another dtrain run that writes its checkpoints there"));
    CHECK(std::filesystem::exists(a + "/checkpoints/latest"));
  }
  c.signal(SIGINT);
  CHECK(c.wait(60) == 130);
}

TEST_CASE("an output folder holding a run is refused without --resume or --overwrite") {
  TempDir dir;
  const std::string cfg = dir.write("cfg.yaml", kCfg);
  const std::string out = dir / "out";
  const std::string base = kBin + " run " + cfg + " --set train.max_steps=40 --out " + out;
  auto r = run_cmd(base + " --log-level warn");
  REQUIRE_MESSAGE(r.exit_code == 0, r.output);
  const std::string summary1 = read_text(out + "/summary.json");

  r = run_cmd(base);
  CHECK(r.exit_code == 2);
  CHECK_MESSAGE(contains(r.output, "error: output folder '" + out + "' already holds a run"),
                r.output);
  CHECK(contains(r.output, "summary.json, metrics.jsonl, checkpoints/"));
  CHECK(contains(r.output, "--resume auto"));
  CHECK(contains(r.output, "--overwrite"));
  CHECK(read_text(out + "/summary.json") == summary1);  // untouched

  // The same refusal from the launcher, before any rank starts.
  r = run_cmd(kBin + " launch --nproc 2 " + cfg + " --out " + out);
  CHECK(r.exit_code == 2);
  CHECK(contains(r.output, "already holds a run"));
  CHECK_FALSE(std::filesystem::exists(out + "/logs"));

  // --overwrite with input the run refuses (a model too large, a DTRAIN_FAULT typo): exit 2 and
  // the old run is as it was (it was deleted first, and nothing trained).
  const std::string launch = kBin + " launch --nproc 2 " + cfg + " --out " + out;
  for (const std::string& bad : {base + " --overwrite --set 'model.hidden=[2600000000]'",
                                 "DTRAIN_FAULT=bogus " + base + " --overwrite",
                                 "DTRAIN_FAULT=bogus " + launch + " --overwrite",
                                 launch + " --overwrite --set 'model.hidden=[2600000000]'"}) {
    r = run_cmd(bad);
    INFO(bad << "\n" << r.output);
    CHECK(r.exit_code == 2);
    CHECK(read_text(out + "/summary.json") == summary1);
    CHECK(std::filesystem::exists(out + "/checkpoints/step-40.safetensors"));
  }
  // A file of the user's in checkpoints/ (a consolidated model saved there): --overwrite would
  // delete it with the folder (it did), so it is refused, run and launch alike, the file kept.
  const std::string mine = dir.write("out/checkpoints/model.safetensors", "weights");
  for (const std::string& cmd : {base + " --overwrite", launch + " --overwrite"}) {
    r = run_cmd(cmd);
    INFO(cmd << "\n" << r.output);
    CHECK(r.exit_code == 2);
    CHECK(contains(r.output, "holds what no dtrain run wrote ('model.safetensors')"));
    CHECK(read_text(mine) == "weights");
  }
  std::filesystem::remove(mine);
  // ... and inside a step folder (a sharded checkpoint's: its manifest and shards only).
  dir.write("out/checkpoints/step-99/notes.txt", "mine");
  r = run_cmd(base + " --overwrite");
  CHECK(r.exit_code == 2);
  CHECK_MESSAGE(contains(r.output, "('step-99/notes.txt')"), r.output);
  std::filesystem::remove_all(out + "/checkpoints/step-99");
  // --overwrite: the old run's files go first; a shorter run leaves no stale checkpoint behind.
  r = run_cmd(base + " --overwrite --set train.max_steps=20 --set train.checkpoint.every_steps=10");
  REQUIRE_MESSAGE(r.exit_code == 0, r.output);
  size_t ckpts = 0;
  for (const auto& e : std::filesystem::directory_iterator(out + "/checkpoints"))
    if (e.path().extension() == ".safetensors") {
      ++ckpts;
      CHECK(e.path().filename() != "step-40.safetensors");
    }
  CHECK(ckpts == 2);
  CHECK(lines_in(out + "/metrics.jsonl") > 0);

  // --resume auto continues it; a resume with nothing left says so and exits 0.
  r = run_cmd(base + " --resume auto");
  REQUIRE_MESSAGE(r.exit_code == 0, r.output);
  CHECK(nlohmann::json::parse(read_text(out + "/summary.json"))["steps"] == 40);
  const std::string config_before = read_text(out + "/config.json");
  r = run_cmd(base + " --resume auto --set optimizer.lr=0.5");
  CHECK(r.exit_code == 0);
  CHECK_MESSAGE(contains(r.output, "nothing to train"), r.output);
  CHECK(contains(r.output, "raise train.max_steps"));
  // The folder is left as it was: its config.json still describes its checkpoints.
  CHECK(read_text(out + "/config.json") == config_before);
  // A run that ended after its last checkpoint but before its final evaluation and summary (a
  // rank lost during them): a restart's --resume auto finishes it instead of exiting 0 with no
  // summary.json.
  const auto done = nlohmann::json::parse(read_text(out + "/summary.json"));
  std::filesystem::remove(out + "/summary.json");
  r = run_cmd(base + " --resume auto");
  REQUIRE_MESSAGE(r.exit_code == 0, r.output);
  CHECK_MESSAGE(contains(r.output, "ended before its final evaluation and summary"), r.output);
  const auto redone = nlohmann::json::parse(read_text(out + "/summary.json"));
  CHECK(redone["status"] == "completed");
  CHECK(redone["steps"] == 40);
  CHECK(redone["steps_this_run"] == 0);
  CHECK(redone["test_accuracy"] == done["test_accuracy"]);
  CHECK(read_text(out + "/config.json") == config_before);
  // An older checkpoint of the folder, of a run completed past it, under a plan that ends there:
  // nothing to train, the folder's results left alone.
  const std::string step20 = out + "/checkpoints/step-20.safetensors";
  REQUIRE(std::filesystem::exists(step20));
  const std::string summary_done = read_text(out + "/summary.json");
  r = run_cmd(kBin + " run " + cfg + " --set train.max_steps=20 --out " + out + " --resume " +
              step20);
  CHECK_MESSAGE(r.exit_code == 0, r.output);
  CHECK_MESSAGE(contains(r.output, "nothing to train"), r.output);
  CHECK(read_text(out + "/summary.json") == summary_done);
  // The same into a new folder: nothing is trained, so no folder is left behind; a folder that
  // already held something keeps it.
  const std::string fresh = dir / "fresh", held = dir / "held";
  const std::string resume = kBin + " run " + cfg + " --set train.max_steps=40 --resume " + out;
  r = run_cmd(resume + "/checkpoints/latest --out " + fresh);
  CHECK_MESSAGE(r.exit_code == 0, r.output);
  CHECK(contains(r.output, "nothing to train"));
  CHECK_FALSE(std::filesystem::exists(fresh));
  std::filesystem::create_directories(held);
  dir.write("held/notes.txt", "mine");
  r = run_cmd(resume + "/checkpoints/latest --out " + held);
  CHECK_MESSAGE(r.exit_code == 0, r.output);
  CHECK(read_text(held + "/notes.txt") == "mine");
}

TEST_CASE(
    "a run resumed under other settings, dead before its summary, is finished by --resume auto") {
  // A completed run's step-20 checkpoint resumed with another learning rate; that run died after
  // its final checkpoint (which replaced the first run's step 40) and before its final
  // evaluation and summary: the folder's summary and step-40 evaluation are the first run's. Its
  // restart took them for its own ("nothing to train", the other weights' figures).
  TempDir dir;
  const std::string cfg = dir.write("cfg.yaml", kCfg);
  const std::string out = dir / "out";
  const std::string base = kBin + " run " + cfg +
                           " --set train.max_steps=40 --set train.checkpoint.every_steps=20 "
                           "--set train.checkpoint.keep_last=5 --out " +
                           out;
  auto r = run_cmd(base);
  REQUIRE_MESSAGE(r.exit_code == 0, r.output);
  const std::string summary_a = read_text(out + "/summary.json");
  const std::string other = base + " --set optimizer.lr=0.2";
  r = run_cmd(other + " --resume " + out + "/checkpoints/step-20.safetensors");
  REQUIRE_MESSAGE(r.exit_code == 0, r.output);
  const auto b_done = nlohmann::json::parse(read_text(out + "/summary.json"));
  REQUIRE(b_done["test_loss"] != nlohmann::json::parse(summary_a)["test_loss"]);
  CHECK(b_done["checkpoint_id"].get<std::string>().starts_with("crc:"));
  CHECK(b_done["checkpoint_id"] != nlohmann::json::parse(summary_a)["checkpoint_id"]);
  dir.write("out/summary.json", summary_a);
  const std::string metrics = read_text(out + "/metrics.jsonl");  // without its final evaluation
  REQUIRE(metrics.size() > 2);
  const size_t last = metrics.rfind('\n', metrics.size() - 2);
  REQUIRE(contains(metrics.substr(last), "\"kind\":\"eval\""));
  dir.write("out/metrics.jsonl", metrics.substr(0, last + 1));
  r = run_cmd(other + " --resume auto");
  REQUIRE_MESSAGE(r.exit_code == 0, r.output);
  CHECK_MESSAGE(contains(r.output, "ended before its final evaluation and summary"), r.output);
  const auto b_redone = nlohmann::json::parse(read_text(out + "/summary.json"));
  CHECK(b_redone["test_loss"] == b_done["test_loss"]);
  CHECK(b_redone["test_accuracy"] == b_done["test_accuracy"]);
  CHECK(b_redone["checkpoint_id"] == b_done["checkpoint_id"]);
  // Finished now: its restart has nothing to train and leaves the results alone.
  const std::string finished = read_text(out + "/summary.json");
  r = run_cmd(other + " --resume auto");
  CHECK_MESSAGE(contains(r.output, "nothing to train"), r.output);
  CHECK(read_text(out + "/summary.json") == finished);
}

TEST_CASE("--resume auto in a folder with an earlier run's records but no checkpoint says so") {
  // It started afresh and replaced them without a word.
  TempDir dir;
  const std::string cfg = dir.write("cfg.yaml", kCfg);
  const std::string out = dir / "out";
  const std::string base = kBin + " run " + cfg + " --set train.max_steps=20 --out " + out;
  auto r = run_cmd(base);
  REQUIRE_MESSAGE(r.exit_code == 0, r.output);
  std::filesystem::remove_all(out + "/checkpoints");
  r = run_cmd(base + " --resume auto");
  CHECK_MESSAGE(r.exit_code == 0, r.output);
  CHECK_MESSAGE(contains(r.output,
                         "starting fresh: the metrics.jsonl and summary.json of the "
                         "earlier run in " +
                             out + " are replaced"),
                r.output);
}

TEST_CASE("a folder a run is writing to is refused to a second run, even with --overwrite") {
  TempDir dir;
  const std::string cfg = dir.write("cfg.yaml", kCfg);
  const std::string out = dir / "out";
  // 3000 steps of 20 ms: the first run writes for a minute unless stopped.
  Child first("DTRAIN_FAULT=delay:rank=0:ms=20 exec " + kBin + " run " + cfg + " --out " + out,
              dir / "first.log");
  REQUIRE(wait_until([&] { return lines_in(out + "/metrics.jsonl") > 0; }, 60));
  // --overwrite would have deleted the first run's files under it, and --resume trained on
  // beside it; a launcher's ranks likewise.
  // DTRAIN_LAUNCHER_PID set by hand (a rank of `dtrain launch` inherits the folder's lock
  // instead of taking it): it skipped the lock, and both runs wrote into the folder.
  const std::string hand = "DTRAIN_LAUNCHER_PID=1 ";
  for (const std::string& how :
       {kBin + " run " + cfg + " --overwrite", kBin + " run " + cfg + " --resume auto",
        kBin + " launch --nproc 2 " + cfg + " --overwrite",
        hand + kBin + " run " + cfg + " --resume auto",
        hand + kBin + " run " + cfg + " --overwrite"}) {
    CAPTURE(how);
    const auto r = run_cmd(how + " --out " + out + " --set train.max_steps=5");
    CHECK(r.exit_code == 2);
    CHECK_MESSAGE(contains(r.output, "is in use by another dtrain run that is writing to it now"),
                  r.output);
  }
  // Rank 1 of a job started by hand (torchrun's contract) does not take the lock, its rank 0
  // does: it must not clear the folder either. Its rank 0 never comes, so it ends at the
  // rendezvous deadline.
  const auto r1 = run_cmd(
      "RANK=1 WORLD_SIZE=2 LOCAL_RANK=1 LOCAL_WORLD_SIZE=2 MASTER_ADDR=127.0.0.1 MASTER_PORT=" +
      std::to_string(dtrain::pick_free_port()) + " " + kBin + " run " + cfg + " --out " + out +
      " --overwrite --set distributed.backend=grpc --set distributed.world_size=2" +
      " --set distributed.rendezvous_timeout_s=1 --log-level warn");
  CHECK(r1.exit_code != 0);
  CHECK(std::filesystem::exists(out + "/metrics.jsonl"));  // nothing of the first run removed
  CHECK(std::filesystem::exists(out + "/config.json"));
  first.signal(SIGINT);
  CHECK(first.wait(30) == 128 + SIGINT);
  // Once it has ended (a SIGKILL releases the lock just as well), the folder is free again.
  const auto r = run_cmd(kBin + " run " + cfg + " --out " + out +
                         " --resume auto --set train.max_steps=2000 --log-level warn");
  CHECK_MESSAGE(r.exit_code == 0, r.output);
}

TEST_CASE("resume keeps one run per folder and survives a lost latest file") {
  TempDir dir;
  const std::string cfg = dir.write("cfg.yaml", kCfg);
  const std::string a = dir / "a", b = dir / "b";
  const std::string run = kBin + " run " + cfg + " --log-level warn --set train.max_steps=";
  REQUIRE(run_cmd(run + "20 --set train.checkpoint.every_steps=10 --out " + a).exit_code == 0);
  REQUIRE(run_cmd(run + "30 --set optimizer.lr=0.5 --out " + b).exit_code == 0);
  const std::string metrics_b = read_text(b + "/metrics.jsonl");

  // Another folder's checkpoint into a folder that holds a run: refused, the folder untouched.
  auto r = run_cmd(run + "40 --out " + b + " --resume " + a + "/checkpoints/step-20.safetensors");
  CHECK(r.exit_code == 2);
  CHECK_MESSAGE(contains(r.output, "already holds a run"), r.output);
  CHECK(contains(r.output, "names a checkpoint of another folder"));
  CHECK(read_text(b + "/metrics.jsonl") == metrics_b);
  // Its own checkpoint, named by path (relative or not), is fine.
  r = run_cmd(run + "30 --out " + b + " --resume " + b + "/checkpoints/../checkpoints");
  CHECK_MESSAGE(r.exit_code == 0, r.output);

  // A resume that fails (another model) leaves the folder's config.json as it was.
  const std::string config_b = read_text(b + "/config.json");
  r = run_cmd(run + "40 --out " + b + " --resume auto --set 'model.hidden=[8]'");
  CHECK(r.exit_code == 2);
  CHECK(read_text(b + "/config.json") == config_b);

  // `latest` lost: --resume auto continues from the newest complete checkpoint, not from step 0.
  std::filesystem::remove(a + "/checkpoints/latest");
  r = run_cmd(kBin + " run " + cfg + " --set train.max_steps=25 --out " + a + " --resume auto");
  REQUIRE_MESSAGE(r.exit_code == 0, r.output);
  CHECK_MESSAGE(contains(r.output, "using its newest complete checkpoint"), r.output);
  // (once: the checkpoint is resolved when checked and again when loaded, and said it twice)
  CHECK(r.output.find("using its newest") == r.output.rfind("using its newest"));
  const auto s = nlohmann::json::parse(read_text(a + "/summary.json"));
  CHECK(s["steps"] == 25);
  CHECK(s["steps_this_run"] == 5);
}

TEST_CASE(
    "resume under another global batch continues after the samples seen, and another "
    "optimizer is named") {
  TempDir dir;
  const std::string cfg = dir.write("cfg.yaml", kCfg);
  const std::string out = dir / "out";
  const std::string run = kBin + " run " + cfg + " --out " + out + " --set train.max_steps=";
  REQUIRE(run_cmd(run + "20 --log-level warn").exit_code == 0);  // 20 x 16 = 320 samples
  auto r = run_cmd(run + "22 --resume auto --set data.batch_size=24");
  REQUIRE_MESSAGE(r.exit_code == 0, r.output);
  CHECK_MESSAGE(contains(r.output,
                         "the sampler's batch (data.batch_size x 1 replica(s); "
                         "train.grad_accum_steps of them make one optimizer step) "
                         "changed from 16 to 24 samples since the checkpoint"),
                r.output);
  CHECK(contains(r.output, "continues after the 320 samples seen, at batch 13 of 100"));
  CHECK(contains(r.output, "(8 samples of the partial batch are seen again)"));
  // SGD's checkpoint under Adam: the optimizer is named, not the first tensor Adam lacks.
  r = run_cmd(run + "30 --resume auto --set 'optimizer={type: adam, lr: 0.01}'");
  CHECK(r.exit_code == 2);
  CHECK_MESSAGE(contains(r.output, "was written by optimizer 'sgd', this run uses 'adam'"),
                r.output);
}

TEST_CASE("resume under another global batch still trains exactly train.epochs") {
  // 2,400 training samples: 150 batches of 16 per epoch, 75 of 32. One epoch first, then the
  // other two under the other batch size: epochs x (this run's steps per epoch) counted the
  // steps already taken as this run's, ending a larger batch's run an epoch early (300 -> 225
  // "steps" already reached at step 150 + 75) and running a smaller one half an epoch past.
  TempDir dir;
  const std::string cfg = dir.write("cfg.yaml", kCfg);
  // The third: stopped two thirds into the last epoch (batch 100 of 150), where the checkpoint's
  // batch index, in its own units, is past the 75 of the new epoch: "nothing to train" was
  // printed and the last epoch's remaining 25 steps dropped.
  for (const auto& [first, then, first_steps, end] : std::vector<std::tuple<int, int, int, int>>{
           {16, 32, 150, 150 + 2 * 75}, {32, 16, 75, 75 + 2 * 150}, {16, 32, 400, 425}}) {
    CAPTURE(first);
    CAPTURE(first_steps);
    const std::string out = dir / ("b" + std::to_string(first) + "-" + std::to_string(first_steps));
    const std::string run = kBin + " run " + cfg + " --out " + out + " --set train.epochs=3";
    REQUIRE(run_cmd(run + " --set train.max_steps=" + std::to_string(first_steps) +
                    " --set data.batch_size=" + std::to_string(first) + " --log-level warn")
                .exit_code == 0);
    const auto r = run_cmd(run + " --set train.max_steps=0 --resume auto --set data.batch_size=" +
                           std::to_string(then) + " --log-level warn");
    REQUIRE_MESSAGE(r.exit_code == 0, r.output);
    const auto s = nlohmann::json::parse(read_text(out + "/summary.json"));
    CHECK(s["steps"] == end);
    CHECK(s["epochs"].get<double>() == doctest::Approx(3.0));
  }
}

TEST_CASE("resume names the config keys that changed and keeps the schedule's horizon") {
  TempDir dir;
  const std::string cfg = dir.write("cfg.yaml", kCfg);
  const std::string out = dir / "out";
  auto r = run_cmd(kBin + " run " + cfg + " --set train.max_steps=30 --out " + out +
                   " --log-level warn");
  REQUIRE_MESSAGE(r.exit_code == 0, r.output);
  r = run_cmd(kBin + " run " + cfg + " --set train.max_steps=60 --set optimizer.lr=0.02 --out " +
              out + " --resume auto --set train.preempt_signal=USR1");
  REQUIRE_MESSAGE(r.exit_code == 0, r.output);
  CHECK_MESSAGE(contains(r.output, "optimizer.lr: 0.05 -> 0.02"), r.output);
  // A key config.json leaves out at its default shows that default, not "(absent)".
  CHECK_MESSAGE(contains(r.output, "train.preempt_signal: \"TERM\" -> \"USR1\""), r.output);
  CHECK(contains(r.output, "train.max_steps: 30 -> 60"));
  CHECK(contains(r.output, "schedule continues as it started"));
  // Past the old horizon the cosine schedule stays at its final rate (min_lr 0), not restarted.
  nlohmann::json rec;
  std::istringstream lines(read_text(out + "/metrics.jsonl"));
  for (std::string line; std::getline(lines, line);) {
    const auto j = nlohmann::json::parse(line);
    if (j["kind"] == "train") rec = j;
  }
  REQUIRE(rec.is_object());
  CHECK(rec["step"] == 60);
  CHECK(rec["lr"].get<double>() < 1e-6);
}

TEST_CASE("a run removes what interrupted or failed checkpoint writes left, and says so") {
  TempDir dir;
  const std::string cfg = dir.write("cfg.yaml", kCfg);
  const std::string out = dir / "out";
  auto r = run_cmd(kBin + " run " + cfg + " --set train.max_steps=20 --out " + out +
                   " --log-level warn");
  REQUIRE_MESSAGE(r.exit_code == 0, r.output);
  // What a SIGKILL during a save leaves: the temp file of the atomic write, never renamed.
  const std::string orphan = out + "/checkpoints/.step-30.safetensors.tmp.Xy12Zw";
  std::filesystem::copy_file(out + "/checkpoints/step-20.safetensors", orphan);
  // ... and what a failed sharded save leaves: a step folder of shards without its manifest (it
  // stayed, full size, beyond keep_last, until a later save of that step).
  const std::string shards = out + "/checkpoints/step-30";
  std::filesystem::create_directories(shards);
  std::filesystem::copy_file(out + "/checkpoints/step-20.safetensors",
                             shards + "/rank-0.safetensors");
  r = run_cmd(kBin + " run " + cfg + " --set train.max_steps=40 --out " + out + " --resume auto");
  REQUIRE_MESSAGE(r.exit_code == 0, r.output);
  CHECK_FALSE(std::filesystem::exists(orphan));
  CHECK_FALSE(std::filesystem::exists(shards));
  CHECK_MESSAGE(contains(r.output,
                         "removed 2 temp file(s) and incomplete checkpoint(s) that "
                         "interrupted or failed checkpoint writes left"),
                r.output);
  // A step folder holding anything else is a user's (weights exported there): kept, by the
  // start and by keep_last's pruning (which took a step above the run's for an abandoned one's).
  const std::string mine = dir.write("out/checkpoints/step-500/model.safetensors", "weights");
  r = run_cmd(kBin + " run " + cfg +
              " --set train.max_steps=80 --set train.checkpoint.every_steps=10 --out " + out +
              " --resume auto");
  REQUIRE_MESSAGE(r.exit_code == 0, r.output);
  CHECK(read_text(mine) == "weights");
}

TEST_CASE(
    "a signal ends a launcher waiting for its nodes and a rank waiting for its peers at once") {
  // Both waits can last minutes (node 0 or rank 0 never comes); nothing is trained yet, so a
  // signal ends them at once: by the signal, or 75 for a rank's preemption signal.
  TempDir dir;
  const std::string cfg = dir.write("cfg.yaml", kCfg);
  const std::string port = std::to_string(dtrain::pick_free_port());
  const std::string launcher =
      "DTRAIN_JOB_TOKEN=tok exec " + kBin + " launch " + cfg +
      " --nnodes 2 --node-rank 0 --nproc-per-node 1 --master-addr 192.0.2.1 --master-port " + port +
      " --out " + dir / "l";
  const std::string rank = "RANK=1 WORLD_SIZE=2 LOCAL_RANK=1 LOCAL_WORLD_SIZE=2 MASTER_ADDR=" +
                           std::string("127.0.0.1 MASTER_PORT=") + port + " exec " + kBin +
                           " run " + cfg + " --out " + dir / "r" +
                           " --set distributed.backend=grpc --set distributed.world_size=2";
  struct Case {
    std::string cmd, waiting;
    int sig, want;
  };
  for (const Case& c :
       {Case{launcher, "waiting for every node's launcher", SIGINT, 128 + SIGINT},
        Case{launcher, "waiting for every node's launcher", SIGTERM, dtrain::kExitPreempted},
        Case{rank, "joining", SIGINT, 128 + SIGINT},
        Case{rank, "joining", SIGTERM, dtrain::kExitPreempted}}) {
    CAPTURE(c.cmd);
    CAPTURE(c.sig);
    Child p(c.cmd, dir / "p.log");
    REQUIRE(wait_until([&] { return contains(read_text(dir / "p.log"), c.waiting); }, 30));
    std::this_thread::sleep_for(std::chrono::milliseconds(300));
    const auto t0 = std::chrono::steady_clock::now();
    p.signal(c.sig);
    const int rc = p.wait(10);
    CHECK_MESSAGE(rc == c.want, read_text(dir / "p.log"));
    CHECK(std::chrono::steady_clock::now() - t0 < std::chrono::seconds(3));
  }
}

TEST_CASE("a launcher as PID 1 (a container's entry point) ends on SIGTERM while it waits") {
  // The kernel drops a default-action signal sent to PID 1: the launcher waiting for its nodes
  // ignored SIGTERM (a pod deleted while its peers were pending was SIGKILLed after its grace
  // period, exit 137). It ends with 75, the preemption code a rank still joining gives too (a
  // Kubernetes pod failure policy ignores it; 143 would fail the Job).
  if (run_cmd("unshare --pid --fork true").exit_code != 0) {
    MESSAGE("skipped: cannot make a PID namespace here (unshare --pid needs root)");
    return;
  }
  TempDir dir;
  const std::string cfg = dir.write("cfg.yaml", kCfg);
  const std::string port = std::to_string(dtrain::pick_free_port());
  const std::string log = dir / "l.log";
  const auto r = run_cmd(
      "DTRAIN_JOB_TOKEN=tok unshare --pid --fork " + kBin + " launch " + cfg +
      " --nnodes 2 --node-rank 0 --nproc-per-node 1 --master-addr 192.0.2.1 --master-port " + port +
      " --out " + dir / "l" + " > " + log + " 2>&1 & u=$!; for i in $(seq 300); do " +
      "grep -q 'waiting for every node' " + log + " && break; sleep 0.1; done; sleep 0.3; " +
      "kill -TERM $(pgrep -P $u); s=$(date +%s); wait $u; echo \"rc $? in $(( $(date +%s) - s ))" +
      " s\"");
  INFO(read_text(log));
  const size_t at = r.output.find("rc 75 in ");
  REQUIRE_MESSAGE(at != std::string::npos, r.output);
  CHECK(std::stoi(r.output.substr(at + 9)) < 5);  // at once, not after a grace period
}

TEST_CASE("a signal while the run loads its data ends it at once, the old run untouched") {
  // A load of minutes went on after a Ctrl-C, then trained a step and wrote its checkpoint,
  // after --overwrite had replaced the run in the folder.
  TempDir dir;
  const std::string cfg = dir.write("cfg.yaml", kCfg);
  const std::string out = dir / "run";
  auto r =
      run_cmd(kBin + " run " + cfg + " --out " + out + " --set train.max_steps=5 --log-level warn");
  REQUIRE_MESSAGE(r.exit_code == 0, r.output);
  const std::string before = read_text(out + "/summary.json");
  for (const int sig : {SIGINT, SIGTERM}) {
    CAPTURE(sig);
    Child c("DTRAIN_FAULT=slow_load:rank=0:ms=20000 exec " + kBin + " run " + cfg + " --out " +
                out + " --overwrite --no-progress",
            dir / "log");
    REQUIRE(wait_until([&] { return contains(read_text(dir / "log"), "slow_load"); }, 60));
    const auto t0 = std::chrono::steady_clock::now();
    c.signal(sig);
    const int rc = c.wait(30);
    const std::string log = read_text(dir / "log");
    CHECK(std::chrono::steady_clock::now() - t0 < std::chrono::seconds(10));
    if (sig == SIGTERM) {
      CHECK_MESSAGE(rc == 75, log);  // the preemption signal: the newest checkpoint is as it was
    } else {
      CHECK_MESSAGE(rc == 128 + SIGINT, log);
    }
    CHECK_MESSAGE(contains(log, "before the run began (nothing to save yet)"), log);
    CHECK(read_text(out + "/summary.json") == before);
    CHECK(std::filesystem::exists(out + "/checkpoints/step-5.safetensors"));
  }
  // A new folder is not left behind, empty.
  Child c("DTRAIN_FAULT=slow_load:rank=0:ms=20000 exec " + kBin + " run " + cfg + " --out " +
              dir / "new" + " --no-progress",
          dir / "log");
  REQUIRE(wait_until([&] { return contains(read_text(dir / "log"), "slow_load"); }, 60));
  c.signal(SIGINT);
  CHECK(c.wait(30) == 128 + SIGINT);
  CHECK_FALSE(std::filesystem::exists(dir / "new"));
}
