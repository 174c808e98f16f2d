// `dtrain verify` through the binary: the shipped ddp, fsdp and pipeline x fsdp configs pass (fast
// settings), the gRPC backend agrees with in-process, a DTRAIN_FAULT is caught with exit 1 at its
// step, and bad input exits 2 with one line.
#include <doctest/doctest.h>

#include <filesystem>
#include <string>

#include <nlohmann/json.hpp>

#include "cli/cli_util.h"
#include "test_util.h"
#include "train/real_data.h"

using namespace dtrain::testing;

namespace {

const std::string kBin = DTRAIN_BIN;
const std::string kConfigs = DTRAIN_SOURCE_DIR "/configs/";
const std::string kFmnist = "/usr/share/datasets/fashion-mnist/train-images-idx3-ubyte.gz";

nlohmann::json verify_json(const std::string& args, int want_exit) {
  const CmdResult r = run_cmd(kBin + " verify " + args + " --json");
  REQUIRE_MESSAGE(r.exit_code == want_exit, r.output);
  const size_t brace = r.output.find('{');
  REQUIRE_MESSAGE(brace != std::string::npos, r.output);
  return nlohmann::json::parse(r.output.substr(brace));
}

}  // namespace

TEST_CASE("dtrain verify passes the shipped ddp, fsdp and pipeline x fsdp configs") {
  if (!std::filesystem::exists(kFmnist)) {
    MESSAGE("Fashion-MNIST not installed; skipped");
    return;
  }
  // Fast settings: 3 steps, one BLAS thread; the configs' own layouts (2 and 4 ranks).
  for (const std::string c : {"fmnist_ddp.yaml", "fmnist_fsdp.yaml", "fmnist_pipeline_fsdp.yaml"}) {
    CAPTURE(c);
    const auto j = verify_json(kConfigs + c + " --steps 3 --set runtime.threads=1", 0);
    CHECK(j["verdict"] == "pass");
    CHECK(j["teacher_forcing"].size() == 3);
    CHECK(j["end_state_worst"]["rel"].get<double>() < 1e-4);
  }
}

TEST_CASE("dtrain verify passes a conv bias under a layer_norm, whose update is only noise") {
  TempDir t;
  if (!write_fmnist_subset(t.path(), 512)) {
    MESSAGE("Fashion-MNIST not installed; skipped");
    return;
  }
  // The bias's true gradient is 0 (the norm removes a per-channel shift): its update is float32
  // noise of a cancelling sum on both sides, measured against its kind's scale. With the floor at
  // 1% of that scale, W = 4 failed at step 1 (rel. 3e-4 to 1.5e-3) on a correct layout.
  const std::string cfg = t.write("cnn.yaml", R"(seed: 5
model:
  type: sequential
  layers: [{conv2d: {out_channels: 4, kernel: 3, stride: 2}}, layer_norm, relu, flatten,
           {linear: 10}]
data: {format: idx, train: {images: images.idx, labels: labels.idx}, test_fraction: 0.1,
       batch_size: 6}
optimizer: {type: sgd, lr: 0.05, momentum: 0.9}
train: {epochs: 1}
distributed: {world_size: 4, strategy: ddp}
runtime: {threads: 1}
)");
  for (const std::string batch : {"6", "7"}) {  // per rank; 7 is no multiple of the conv's block
    CAPTURE(batch);
    const auto j = verify_json(cfg + " --steps 3 --set data.batch_size=" + batch, 0);
    CHECK(j["verdict"] == "pass");
  }
}

TEST_CASE("dtrain verify over gRPC, a doubled gradient caught at its step, bad input") {
  TempDir t;
  const std::string cfg = t.write("c.yaml", R"(seed: 2
model: {hidden: [12], activation: tanh}
data:
  format: synthetic
  synthetic: {samples: 300, features: 6, classes: 3}
  batch_size: 10
optimizer: {type: sgd, lr: 0.1, momentum: 0.9}
distributed: {world_size: 2, strategy: zero1, timeout_s: 30}
runtime: {threads: 1}
)");
  const auto g = verify_json(
      cfg + " --steps 3 --backend grpc --master-port " + std::to_string(free_port()), 0);
  CHECK(g["verdict"] == "pass");
  CHECK(g["tolerance"].get<double>() == 1e-3);  // SGD's default
  {
    // --master-port: a port another process holds is refused up front (a firewall's range is
    // why one is given), and it is the gRPC ranks' port: refused with the in-process backend.
    const HeldPort held;
    const std::string p = std::to_string(held.port());
    const CmdResult taken = run_cmd(kBin + " verify " + cfg + " --backend grpc --master-port " + p);
    CHECK_MESSAGE(taken.exit_code == 2, taken.output);
    CHECK(taken.output.find("--master-port " + p + ": port " + p + " is taken") !=
          std::string::npos);
    const CmdResult inproc = run_cmd(kBin + " verify " + cfg + " --master-port " + p);
    CHECK_MESSAGE(inproc.exit_code == 2, inproc.output);
    CHECK(inproc.output.find("--master-port is for --backend grpc") != std::string::npos);
  }
  // The text report names the verdict; the fault makes it fail at step 2 with exit 1.
  const CmdResult ok = run_cmd(kBin + " verify " + cfg + " --steps 2");
  CHECK_MESSAGE(ok.exit_code == 0, ok.output);
  CHECK(ok.output.find("verdict: PASS") != std::string::npos);
  const CmdResult bad =
      run_cmd("DTRAIN_FAULT=grad_scale:rank=0:step=2 " + kBin + " verify " + cfg + " --steps 3");
  CHECK_MESSAGE(bad.exit_code == 1, bad.output);
  CHECK_MESSAGE(bad.output.find("verdict: FAIL at step 2") != std::string::npos, bad.output);
  // A fault that ends a process ends in-process verify itself (exit 137, no verdict, its work
  // folder left): refused; and one on a rank that writes no checkpoint file never fires.
  for (const std::string fault :
       {"kill:rank=1:step=2", "kill_in_save:rank=0:step=2", "drop:rank=0:step=1"}) {
    const CmdResult r = run_cmd("DTRAIN_FAULT=" + fault + " " + kBin + " verify " + cfg);
    CHECK_MESSAGE(r.exit_code == 2, r.output);
    CHECK(r.output.find("in-process ranks are threads of verify's own") != std::string::npos);
  }
  const CmdResult unfired = run_cmd("DTRAIN_FAULT=kill_in_save:rank=1:step=2 " + kBin + " run " +
                                    cfg + " --set distributed.strategy=ddp --out " + t / "unfired");
  CHECK_MESSAGE(unfired.exit_code == 2, unfired.output);
  CHECK(unfired.output.find("which rank 0 writes alone") != std::string::npos);
  CHECK_FALSE(std::filesystem::exists(t / "unfired/summary.json"));
  // --tolerance 0 asks for exact equality: it is kept, not replaced by the default.
  {
    const CmdResult r = run_cmd(kBin + " verify " + cfg + " --steps 1 --tolerance 0 --json");
    const size_t brace = r.output.find('{');
    REQUIRE_MESSAGE(brace != std::string::npos, r.output);
    const auto j = nlohmann::json::parse(r.output.substr(brace));
    CHECK(j["tolerance"].get<double>() == 0.0);
  }
  // Bad input: one line, exit 2.
  for (const std::string& args :
       {cfg + " --steps 0", cfg + " --tolerance -1", t.path() + "/missing.yaml",
        cfg + " --set distributed.world_size=3 --set distributed.pipeline.stages=2"}) {
    CAPTURE(args);
    const CmdResult r = run_cmd(kBin + " verify " + args);
    CHECK_MESSAGE(r.exit_code == 2, r.output);
    CHECK(r.output.find("error") != std::string::npos);
  }
  // --out: verify replaces its subfolders, so a folder of the user's is refused and left as it
  // was; a new folder, and the same one again, are verify's own.
  std::filesystem::create_directories(t / "mine/layout");
  t.write("mine/layout/notes.txt", "precious");
  const CmdResult mine = run_cmd(kBin + " verify " + cfg + " --steps 1 --out " + t / "mine");
  CHECK_MESSAGE(mine.exit_code == 2, mine.output);
  CHECK(mine.output.find("holds files verify did not write") != std::string::npos);
  CHECK(std::filesystem::file_size(t / "mine/layout/notes.txt") == 8);
  // A file, or a device, is not a folder (it was called "a folder that holds files").
  for (const std::string& out : {t.write("a-file", "x"), std::string("/dev/null")}) {
    const CmdResult r = run_cmd(kBin + " verify " + cfg + " --steps 1 --out " + out);
    CHECK(r.exit_code == 2);
    CHECK_MESSAGE(r.output.find("exists and is not a folder") != std::string::npos, r.output);
  }
  for (int i = 0; i < 2; ++i) {
    const CmdResult r = run_cmd(kBin + " verify " + cfg + " --steps 1 --out " + t / "work");
    CHECK_MESSAGE(r.exit_code == 0, r.output);
  }
}

TEST_CASE("an interrupted dtrain verify removes its temporary folder and says so") {
  // It died by the signal's default action: no word, and its /tmp/dtrain-verify-* (15 MB) left.
  for (const std::string backend : {"inproc", "grpc"}) {
    CAPTURE(backend);
    TempDir dir;
    const std::string tmp = dir / "tmp";
    std::filesystem::create_directories(tmp);
    Child c("TMPDIR=" + tmp + " DTRAIN_FAULT=delay:rank=0:ms=20 exec " + kBin + " verify " +
                kConfigs + "smoke.yaml --steps 300 --backend " + backend +
                " --set distributed.world_size=2",
            dir / "verify.log");
    // Under way once its work folder holds a run's metrics.
    const auto running = [&] {
      for (const auto& e : std::filesystem::recursive_directory_iterator(tmp))
        if (e.path().filename() == "metrics.jsonl") return true;
      return false;
    };
    REQUIRE(wait_until(running, 60));
    c.signal(SIGINT);
    const int rc = c.wait(60);
    const std::string log = read_text(dir / "verify.log");
    CHECK_MESSAGE(rc == 130, log);
    CHECK_MESSAGE(contains(log, "verify: interrupted by SIGINT; nothing was verified"), log);
    CHECK_MESSAGE(std::filesystem::is_empty(tmp), log);
  }
}

TEST_CASE("a second signal to dtrain verify after its first run ends it by the signal, not 0") {
  // The first finished run (the reference) left its exit code 0 as the process's code for a
  // second signal: verify then exited 0 with no report, which reads as a pass.
  TempDir dir;
  const std::string out = dir / "out";
  Child c("DTRAIN_FAULT=delay:rank=0:ms=300 exec " + kBin + " verify " + kConfigs +
              "smoke.yaml --steps 40 --out " + out + " --set distributed.world_size=2",
          dir / "verify.log");
  REQUIRE(wait_until([&] { return std::filesystem::exists(out + "/reference/summary.json"); }, 60));
  c.signal(SIGINT);
  std::this_thread::sleep_for(std::chrono::milliseconds(2000));  // past "the same request"
  c.signal(SIGINT);
  const int rc = c.wait(60);
  CHECK_MESSAGE(rc == 130, read_text(dir / "verify.log"));
}

TEST_CASE("verify: Local SGD's uneven last batch, lossy layouts' JSON, a failed run's kept logs") {
  TempDir t;
  // 130 samples, 104 training rows: 3 replicas x batch 16 leave a last batch of 8 (3/3/2). With
  // per-replica momentum the free run leaves one process's there by design; every step from the
  // same state agrees (it was a FAIL naming the end state).
  const std::string cfg = t.write("c.yaml", R"(seed: 7
model: {hidden: [32, 32], activation: relu}
data:
  format: synthetic
  synthetic: {samples: 130, features: 16, classes: 4, noise: 0.5}
  batch_size: 16
optimizer: {type: sgd, lr: 0.05, momentum: 0.9}
distributed: {world_size: 3, strategy: local_sgd, local_sgd: {sync_every: 1}}
runtime: {threads: 1}
)");
  const auto j = verify_json(cfg + " --steps 4", 0);
  CHECK(j["verdict"] == "pass");
  CHECK_MESSAGE(j["free_run"].is_string(), j.dump());
  CHECK(j["free_run"].get<std::string>().find("step 3 splits its batch unevenly") == 0);
  CHECK(j["end_step"] == 2);  // the free run is judged up to the step before
  CHECK(j["end_state_worst"]["rel"].get<double>() <= j["tolerance"].get<double>());
  // Evenly split (drop_last): the free run is judged, and passes.
  const auto even = verify_json(cfg + " --steps 4 --set data.drop_last=true", 0);
  CHECK(even["free_run"].is_null());
  // A lossy layout fails no step: first_failing_step is null, as its text report says.
  std::string text = read_text(cfg);
  text.replace(text.find("local_sgd, local_sgd: {sync_every: 1}"),
               std::string("local_sgd, local_sgd: {sync_every: 1}").size(), "ddp");
  const std::string ddp = t.write("ddp.yaml", text);
  const auto lossy = verify_json(ddp + " --steps 2 --set distributed.compression.type=int8", 0);
  CHECK(lossy["verdict"] == "diverges as expected");
  CHECK(lossy["first_failing_step"].is_null());
  // A gRPC layout run that fails: the rank logs its message names are still there.
  const CmdResult r = run_cmd("DTRAIN_FAULT=kill:rank=1:step=2 " + kBin + " verify " + ddp +
                              " --steps 3 --backend grpc");
  CHECK(r.exit_code == 1);
  const size_t at = r.output.find("rank logs in ");
  REQUIRE_MESSAGE(at != std::string::npos, r.output);
  std::string logs = r.output.substr(at + 13);
  logs = logs.substr(0, logs.find_first_of("\n "));
  CHECK_MESSAGE(std::filesystem::is_directory(logs), logs);
  CHECK(std::filesystem::exists(logs + "/rank-1.log"));
  std::filesystem::remove_all(std::filesystem::path(logs).parent_path().parent_path());
}
