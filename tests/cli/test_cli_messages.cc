// The messages of a newcomer's first hour, through the real binary: what `validate` (and `run`,
// before anything heavy) checks without reading data, and the one-line errors for a port in
// use, a missing config, a bad CSV delimiter and a file that is not a checkpoint.
#include <doctest/doctest.h>

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <filesystem>
#include <string>
#include <utility>
#include <vector>

#include "test_util.h"

using dtrain::testing::be32;
using dtrain::testing::CmdResult;
using dtrain::testing::contains;
using dtrain::testing::run_cmd;
using dtrain::testing::TempDir;

namespace {

const std::string kBin = DTRAIN_BIN;

CmdResult run_dtrain(const std::string& args) {
  return run_cmd(kBin + " " + args);
}

size_t lines(const std::string& s) {
  return static_cast<size_t>(std::count(s.begin(), s.end(), '\n'));
}

const char* kTiny = R"(seed: 3
model: {hidden: [16]}
data:
  format: synthetic
  synthetic: {samples: 600, features: 5, classes: 3, noise: 0.3}
  batch_size: 20
optimizer: {type: sgd, lr: 0.1}
train: {epochs: 1, log_every: 10}
runtime: {threads: 1}
)";

// n images of 2x2 pixels and their labels (0, 1, 0, 1, ...), as IDX files in `dir`.
void write_idx(const TempDir& dir, uint32_t n) {
  dir.write("img.idx", be32(0x803) + be32(n) + be32(2) + be32(2) + std::string(n * 4, '\x7f'));
  std::string labels;
  for (uint32_t i = 0; i < n; ++i) labels += static_cast<char>(i % 2);
  dir.write("lab.idx", be32(0x801) + be32(n) + labels);
}

// A TCP socket listening on a free loopback port, closed at scope exit.
struct Listener {
  int fd = -1;
  int port = 0;
  Listener() {
    fd = socket(AF_INET, SOCK_STREAM, 0);
    REQUIRE(fd >= 0);
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    socklen_t len = sizeof(a);
    REQUIRE(bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof(a)) == 0);
    REQUIRE(listen(fd, 1) == 0);
    REQUIRE(getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len) == 0);
    port = ntohs(a.sin_port);
  }
  ~Listener() { close(fd); }
};

}  // namespace

TEST_CASE("a directory or an empty file as the config: one clear error, exit 2") {
  TempDir dir;
  const std::string empty = dir.write("empty.yaml", "");
  const std::string blank = dir.write("blank.yaml", "\n  \n");
  for (const char* cmd : {"validate", "run"}) {
    CAPTURE(cmd);
    auto r = run_dtrain(std::string(cmd) + " " + dir.path());
    CHECK(r.exit_code == 2);
    CHECK(r.output == "error: config '" + dir.path() +
                          "' is a directory, not a file (give a YAML file, e.g. "
                          "configs/smoke.yaml)\n");
    for (const std::string& f : {empty, blank}) {
      r = run_dtrain(std::string(cmd) + " " + f);
      CHECK(r.exit_code == 2);
      CHECK(r.output.starts_with("error: config '" + f + "' is empty"));
      CHECK(lines(r.output) == 1);
      CHECK_FALSE(contains(r.output, "data.train.images"));
    }
  }
  const auto r = run_dtrain("validate " + dir / "nothere.yaml");
  CHECK(r.exit_code == 2);
  CHECK(r.output == "error: config '" + dir / "nothere.yaml" + "' does not exist\n");
}

TEST_CASE("validate and run name the key, line:col and path of a missing input file") {
  TempDir dir;
  write_idx(dir, 10);
  const std::string cfg = dir.write("idx.yaml",
                                    "data:\n"
                                    "  format: idx\n"
                                    "  train:\n"
                                    "    images: img.idx\n"
                                    "    labels: missing.idx\n"
                                    "train: {epochs: 1}\n");
  const std::string want =
      "error: " + cfg + ":5:13: data.train.labels: '" + dir / "missing.idx" + "' does not exist\n";
  auto r = run_dtrain("validate " + cfg);
  CHECK(r.exit_code == 2);
  CHECK(r.output == want);
  // run refuses the same way before anything else (no rank, data or model line).
  r = run_dtrain("run " + cfg + " --out " + dir / "run");
  CHECK(r.exit_code == 2);
  CHECK(r.output == want);
  CHECK_FALSE(std::filesystem::exists(dir / "run"));
  // launch, once, before any rank starts (no rank logs).
  r = run_dtrain("launch --nproc 2 " + cfg + " --out " + dir / "launched");
  CHECK(r.exit_code == 2);
  CHECK(r.output == want);
  CHECK_FALSE(std::filesystem::exists(dir / "launched"));

  // A value from --set is located there; a directory is not a data file.
  r = run_dtrain("validate " + cfg + " --set data.train.labels=" + dir.path());
  CHECK(r.exit_code == 2);
  CHECK(r.output == "error: --set data.train.labels=" + dir.path() + ": data.train.labels: '" +
                        dir.path() + "' is a directory, not a file\n");
  r = run_dtrain("validate " + cfg + " --set data.train.labels=lab.idx");
  CHECK(r.exit_code == 2);  // relative to the working directory, as any command-line path
  const std::string cwd = std::filesystem::current_path().string();
  CHECK(contains(r.output, "data.train.labels: '" + cwd + "/lab.idx' does not exist"));
  r = run_dtrain("validate " + cfg + " --set data.train.labels=" + dir / "lab.idx");
  CHECK_MESSAGE(r.exit_code == 0, r.output);

  // Test set, CSV path, token and TLS files are input files too.
  r = run_dtrain("validate " + cfg + " --set data.train.labels=" + dir / "lab.idx" +
                 " --set 'data.test={images: " + dir / "img.idx" + ", labels: " + dir / "nope.idx" +
                 "}'");
  CHECK(r.exit_code == 2);
  CHECK(contains(r.output, "data.test.labels: '" + dir / "nope.idx" + "' does not exist"));
  const std::string csv = dir.write("csv.yaml", "data:\n  format: csv\n  train: {path: no.csv}\n");
  r = run_dtrain("validate " + csv);
  CHECK(r.exit_code == 2);
  CHECK(r.output ==
        "error: " + csv + ":3:17: data.train.path: '" + dir / "no.csv" + "' does not exist\n");
  const std::string syn = dir.write("syn.yaml", std::string(kTiny) +
                                                    "distributed:\n"
                                                    "  token_file: token.txt\n");
  r = run_dtrain("validate " + syn);
  CHECK(r.exit_code == 2);
  CHECK(r.output == "error: " + syn + ":11:15: distributed.token_file: '" + dir / "token.txt" +
                        "' does not exist\n");
  dir.write("token.txt", "secret\n");
  r = run_dtrain("validate " + syn);
  CHECK_MESSAGE(r.exit_code == 0, r.output);
  r = run_dtrain("validate " + syn +
                 " --set 'distributed.tls={cert: token.txt, key: token.txt, ca: ca.pem}'");
  CHECK(r.exit_code == 2);
  CHECK(contains(r.output, "distributed.tls.cert: '" + cwd + "/token.txt' does not exist"));
  // Files that exist but are no certificate: refused by validate too, as the gRPC ranks refuse
  // them (before, validate said ok and the ranks "cannot listen ... port in use").
  dir.write("ca.pem", "not a certificate\n");
  r = run_dtrain("validate " + syn + " --set distributed.backend=grpc" +
                 " --set 'distributed.tls={cert: " + dir / "token.txt" +
                 ", key: " + dir / "token.txt" + ", ca: " + dir / "ca.pem" + "}'");
  CHECK(r.exit_code == 2);
  CHECK_MESSAGE(contains(r.output, "distributed.tls.cert: '" + dir / "token.txt" +
                                       "' holds no PEM certificate"),
                r.output);
}

TEST_CASE("validate and run warn when some ranks would get no training samples") {
  TempDir dir;
  const std::string cfg = dir.write("tiny.yaml", kTiny);
  // Synthetic: 5 samples, 1 held out (test_fraction 0.2): 4 training samples for 16 ranks.
  const std::string few = " --set data.synthetic.samples=5 --set distributed.world_size=16";
  const std::string warning =
      "16 ranks share 4 training samples: 12 ranks get none and only wait for the others (use "
      "fewer ranks or more data)";
  auto r = run_dtrain("validate " + cfg + few);
  CHECK(r.exit_code == 0);
  CHECK(contains(r.output, warning));
  CHECK(contains(r.output, ": ok (config hash"));
  r = run_dtrain("validate " + cfg +
                 " --set data.synthetic.samples=5 --set "
                 "distributed.world_size=4");
  CHECK(r.exit_code == 0);
  CHECK_FALSE(contains(r.output, "training samples"));
  r = run_dtrain("run " + cfg + few + " --out " + dir / "run --log-level warn");
  CHECK_MESSAGE(r.exit_code == 0, r.output);
  CHECK(contains(r.output, warning));

  // IDX: the count comes from the labels file's header, gzip or not.
  write_idx(dir, 3);
  const std::string idx =
      dir.write("idx.yaml",
                "data:\n  format: idx\n  train: {images: img.idx, labels: lab.idx}\n"
                "train: {epochs: 1}\ndistributed: {world_size: 5}\n");
  r = run_dtrain("validate " + idx);
  CHECK(r.exit_code == 0);
  CHECK(contains(r.output, "5 ranks share 3 training samples: 2 ranks get none and only wait"));
  REQUIRE(run_cmd("gzip -k " + dir / "lab.idx").exit_code == 0);
  r = run_dtrain("validate " + idx + " --set data.train.labels=" + dir / "lab.idx.gz");
  CHECK(r.exit_code == 0);
  CHECK(contains(r.output, "5 ranks share 3 training samples: 2 ranks get none and only wait"));
  // Pipelines count replicas (world_size / stages).
  const std::string pipe =
      " --set data.synthetic.samples=4 --set distributed.world_size=8 --set "
      "distributed.strategy=pipeline --set distributed.pipeline.stages=2 --set data.batch_size=4";
  const std::string pipe_warning =
      "8 ranks (4 pipeline replicas) share 3 training samples: 1 replica gets none";
  r = run_dtrain("validate " + cfg + pipe);
  CHECK_MESSAGE(r.exit_code == 0, r.output);
  CHECK(contains(r.output, pipe_warning));
  r = run_dtrain("run " + cfg + pipe + " --out " + dir / "piperun --log-level warn");
  CHECK_MESSAGE(r.exit_code == 0, r.output);
  CHECK(contains(r.output, pipe_warning));

  // CSV: the size is not known without reading; the run warns once it has loaded the data.
  dir.write("d.csv", "a,b,label\n1,2,0\n3,4,1\n5,6,0\n");
  const std::string csv = dir.write("csv.yaml",
                                    "model: {hidden: [4]}\ndata:\n  format: csv\n  train: {path: "
                                    "d.csv}\n  batch_size: 2\ntrain: {epochs: 1}\n"
                                    "distributed: {world_size: 4}\nruntime: {threads: 1}\n");
  r = run_dtrain("validate " + csv);
  CHECK(r.exit_code == 0);
  CHECK_FALSE(contains(r.output, "training samples"));
  r = run_dtrain("run " + csv + " --out " + dir / "csvrun --log-level warn");
  CHECK_MESSAGE(r.exit_code == 0, r.output);
  CHECK(contains(r.output, "4 ranks share 3 training samples: 1 rank gets none and only waits"));
}

TEST_CASE("training data with one label throughout is refused, whichever label it is") {
  TempDir dir;
  for (const std::string label : {"0", "3"}) {
    CAPTURE(label);
    dir.write("one.csv", "a,b,label\n1,2," + label + "\n3,4," + label + "\n5,6," + label + "\n");
    const std::string cfg = dir.write("one.yaml",
                                      "model: {hidden: [4]}\ndata:\n  format: csv\n  train: "
                                      "{path: one.csv}\n  batch_size: 2\ntrain: {epochs: 1}\n");
    const auto r = run_dtrain("run " + cfg + " --out " + dir / ("run" + label));
    CHECK(r.exit_code == 2);
    CHECK_MESSAGE(contains(r.output, "error: the training data has a single class"), r.output);
  }
}

TEST_CASE("a rank 0 whose master port is taken: dtrain's one line naming why, no raw gRPC line") {
  TempDir dir;
  const std::string cfg = dir.write("tiny.yaml", kTiny);
  const Listener taken;
  const std::string env =
      "RANK=0 WORLD_SIZE=2 MASTER_ADDR=127.0.0.1 MASTER_PORT=" + std::to_string(taken.port) +
      " DTRAIN_JOB_TOKEN=t ";
  const std::string args = " run " + cfg + " --out " + dir / "run";
  const std::string want =
      "error: rank 0 cannot listen on 127.0.0.1:" + std::to_string(taken.port) +
      " for the rendezvous (port " + std::to_string(taken.port) +
      " is taken on this host by another process: another job, a second process given RANK=0, or "
      "a rank of an earlier run still running; choose another MASTER_PORT (dtrain launch picks a "
      "free one unless --master-port is given))\n";
  auto r = run_cmd(env + kBin + args + " --log-level warn");
  CHECK(r.exit_code == 1);
  CHECK(r.output == want);
  r = run_cmd(env + kBin + args);  // at info: the joining line, then the error
  CHECK(r.exit_code == 1);
  CHECK(r.output.ends_with(want));
  CHECK_FALSE(contains(r.output, "chttp2"));
  CHECK_FALSE(contains(r.output, "Address already in use"));
  // With --log-level debug gRPC's own lines are there, through dtrain's logger.
  r = run_cmd(env + kBin + args + " --log-level debug");
  CHECK(r.exit_code == 1);
  CHECK(contains(r.output, "[debug] grpc error "));
  CHECK(contains(r.output, "Address already in use"));
}

TEST_CASE("command-line errors: 'error: ...' and where the options are, exit 2") {
  auto r = run_dtrain("run");
  CHECK(r.exit_code == 2);
  CHECK(r.output == "error: config is required\nrun 'dtrain run --help' for the options\n");
  r = run_dtrain("");
  CHECK(r.exit_code == 2);
  CHECK(r.output.starts_with("error: 'dtrain' needs a command: run, launch, "));
  CHECK(r.output.ends_with(", bench\nrun 'dtrain --help' for the options\n"));
  // A misspelt or missing second-level command is named with its parent's choices (it said
  // "A subcommand is required" for 'dtrain checkpoint bogus').
  r = run_dtrain("checkpoint bogus");
  CHECK(r.exit_code == 2);
  CHECK(r.output ==
        "error: unknown command 'bogus' for 'dtrain checkpoint' (commands: "
        "consolidate)\nrun 'dtrain checkpoint --help' for the options\n");
  r = run_dtrain("bench");
  CHECK(r.exit_code == 2);
  CHECK(r.output ==
        "error: 'dtrain bench' needs a command: gemm, step, comm, tp\nrun 'dtrain "
        "bench --help' for the options\n");
  r = run_dtrain("--log-level warn frobnicate x.yaml");
  CHECK(r.exit_code == 2);
  CHECK(r.output.starts_with("error: unknown command 'frobnicate' (commands: run, launch, "));
  CHECK(r.output.ends_with(")\nrun 'dtrain --help' for the options\n"));
  // A command taken as --log-level's value, or after "--", is said as such ("unknown command
  // 'x.yaml'" and "unknown command 'run'" before).
  CHECK(run_dtrain("--log-level validate x.yaml")
            .output.starts_with("error: --log-level needs its level before the command"));
  CHECK(run_dtrain("-- run x.yaml").output.starts_with("error: '--' ends the options"));
  r = run_dtrain("eval x.yaml");
  CHECK(r.exit_code == 2);
  CHECK(r.output == "error: --checkpoint is required\nrun 'dtrain eval --help' for the options\n");
  r = run_dtrain("checkpoint consolidate");
  CHECK(r.exit_code == 2);
  CHECK(r.output.ends_with("\nrun 'dtrain checkpoint consolidate --help' for the options\n"));
  // --overwrite with --resume: the two contradict each other, wherever --resume points (the
  // message said --overwrite would delete the checkpoints --resume reads, also for another folder).
  r = run_dtrain(std::string("run ") + DTRAIN_SOURCE_DIR +
                 "/configs/smoke.yaml --overwrite --resume /tmp/elsewhere --out "
                 "/tmp/dtrain-no-such-out-folder");
  CHECK(r.exit_code == 2);
  CHECK(contains(r.output,
                 "--overwrite (start afresh, deleting what --out holds) and --resume "
                 "(continue a run) contradict each other: give one of them"));
  for (const char* args : {"run --bogus x.yaml", "--log-level loud run x.yaml", "frobnicate"}) {
    r = run_dtrain(args);
    CAPTURE(args);
    CHECK(r.exit_code == 2);
    CHECK(r.output.starts_with("error: "));
    CHECK(lines(r.output) == 2);
  }
  // Ranks and ports are decimal, as their environment variables are read: CLI11 took "010" as
  // octal 8 and "0x1f" as 31.
  for (const char* args :
       {"run x.yaml --rank 010", "run x.yaml --world-size 0x2", "run x.yaml --master-port +29500",
        "launch x.yaml --node-rank 01", "launch x.yaml --nproc-per-node ' 2'",
        // bench's counts too (--nproc 010 ran 8 ranks; --threads "" took all cores)
        "bench comm --nproc 010", "bench comm --iters 0x2", "bench comm --in-flight 02",
        "bench gemm --batch 010", "bench gemm --threads ''", "bench gemm --iters +3",
        "bench step x.yaml --steps 0x28", "bench step x.yaml --block 010",
        "bench tp x.yaml --iters 0x2"}) {
    r = run_dtrain(args);
    CAPTURE(args);
    CHECK(r.exit_code == 2);
    CHECK(contains(r.output, "must be a decimal integer"));
  }
}

TEST_CASE("CSV delimiter from --set: one character as typed, \\t a tab, a clear error else") {
  TempDir dir;
  dir.write("comma.csv", "a,b,label\n1,2,0\n3,4,1\n5,6,0\n7,8,1\n");
  dir.write("tab.csv", "a\tb\tlabel\n1\t2\t0\n3\t4\t1\n5\t6\t0\n7\t8\t1\n");
  dir.write("semi.csv", "a;b;label\n1;2;0\n3;4;1\n5;6;0\n7;8;1\n");
  const auto cfg_for = [&](const std::string& csv) {
    return dir.write(csv + ".yaml",
                     "model: {hidden: [4]}\ndata:\n  format: csv\n  train: {path: " + csv +
                         "}\n  batch_size: 2\ntrain: {epochs: 1}\n"
                         "runtime: {threads: 1}\n");
  };
  const std::string comma = cfg_for("comma.csv"), tab = cfg_for("tab.csv"),
                    semi = cfg_for("semi.csv");
  for (const auto& [cfg, delim] : {std::pair{comma, std::string(",")},
                                   {tab, std::string("'\\t'")},
                                   {semi, "';'"},
                                   {semi, "\"';'\""},
                                   {tab, "'\"\\t\"'"}}) {
    CAPTURE(delim);
    const auto r = run_dtrain("run " + cfg + " --set data.csv.delimiter=" + delim + " --out " +
                              dir / "run --overwrite --log-level warn");
    CHECK_MESSAGE(r.exit_code == 0, r.output);
  }
  // The wrong delimiter for the file: the loader says so (one column, not three).
  auto r = run_dtrain("run " + tab + " --set data.csv.delimiter=, --out " + dir / "run");
  CHECK(r.exit_code == 2);
  // An unquoted \t in the file is a tab too.
  const std::string in_file =
      dir.write("tab2.yaml",
                "model: {hidden: [4]}\ndata:\n  format: csv\n  train: {path: tab.csv}\n  csv: "
                "{delimiter: \\t}\n  batch_size: 2\ntrain: {epochs: 1}\n");
  r = run_dtrain("validate " + in_file);
  CHECK_MESSAGE(r.exit_code == 0, r.output);

  r = run_dtrain("validate " + comma + " --set data.csv.delimiter=ab");
  CHECK(r.exit_code == 2);
  CHECK(r.output ==
        "error: --set data.csv.delimiter=ab: data.csv.delimiter: must be exactly one character "
        "(got 'ab'; e.g. --set data.csv.delimiter=';', or '\\t' for a tab)\n");
  // One character on screen, two bytes: the reader splits on bytes, so it must be ASCII.
  r = run_dtrain("validate " + comma + " --set 'data.csv.delimiter=\xc3\xa9'");
  CHECK(r.exit_code == 2);
  CHECK(r.output ==
        "error: --set data.csv.delimiter=\xc3\xa9: data.csv.delimiter: must be one ASCII "
        "character ('\xc3\xa9' is 2 bytes in UTF-8; e.g. --set data.csv.delimiter=';', or '\\t' "
        "for a tab)\n");
  r = run_dtrain("validate " + comma + " --set data.csv.delimiter=");
  CHECK(r.exit_code == 2);
  CHECK(contains(r.output, "must be exactly one character (got ''"));
  r = run_dtrain("validate " + comma + " --set 'data.csv.delimiter=\"'");
  CHECK(r.exit_code == 2);
  CHECK(contains(r.output, "data.csv.delimiter: cannot be a newline or a double quote"));
  const std::string bare = dir.write(
      "bare.yaml", "data:\n  format: csv\n  train: {path: comma.csv}\n  csv:\n    delimiter:\n");
  r = run_dtrain("validate " + bare);
  CHECK(r.exit_code == 2);
  CHECK(contains(r.output, "data.csv.delimiter: must be one character, got no value"));
}

TEST_CASE("--resume and --checkpoint on a non-checkpoint: one line, before the data is loaded") {
  TempDir dir;
  // The data would fail to load (line 3), so an error about the checkpoint shows that it was
  // checked first.
  dir.write("bad.csv", "a,b,label\n1,2,0\n3,x,1\n");
  const std::string cfg =
      dir.write("csv.yaml",
                "data:\n  format: csv\n  train: {path: bad.csv}\n  csv: {label_column: label}\n"
                "train: {epochs: 1}\n");
  const std::string yaml = cfg;  // a YAML file is not a checkpoint
  const std::string not_st =
      "error: '" + yaml + "' is not a safetensors file (corrupt header length ";
  auto r = run_dtrain("run " + cfg + " --resume " + yaml + " --out " + dir / "run");
  CHECK(r.exit_code == 2);
  CHECK(r.output.starts_with(not_st));
  CHECK(lines(r.output) == 1);
  for (const char* cmd : {"eval", "predict --input " __FILE__}) {
    CAPTURE(cmd);
    r = run_dtrain(std::string(cmd) + " " + cfg + " --checkpoint " + yaml);
    CHECK(r.exit_code == 2);
    CHECK(r.output.starts_with(not_st));
    CHECK(lines(r.output) == 1);
  }
  // Short files, and files that are safetensors but not dtrain checkpoints.
  const std::string tiny = dir.write("tiny.bin", "abc");
  r = run_dtrain("eval " + cfg + " --checkpoint " + tiny);
  CHECK(r.output == "error: '" + tiny +
                        "' is not a safetensors file (truncated: 3 bytes, shorter than the 8-byte "
                        "header length field)\n");
  const std::string header = "{\"__metadata__\":{\"format\":\"other\"}}";
  std::string st(8, '\0');
  st[0] = static_cast<char>(header.size());
  const std::string other = dir.write("other.safetensors", st + header);
  r = run_dtrain("run " + cfg + " --resume " + other + " --out " + dir / "run");
  CHECK(r.exit_code == 2);
  CHECK(r.output == "error: checkpoint '" + other +
                        "': not a dtrain checkpoint (no format=dtrain-checkpoint in "
                        "__metadata__; model weights from elsewhere, such as a PyTorch "
                        "state_dict, start a run through train.init_from)\n");
  r = run_dtrain("run " + cfg + " --resume " + dir / "nothere" + " --out " + dir / "run");
  CHECK(r.output == "error: checkpoint '" + dir / "nothere" + "' does not exist\n");
  // launch checks once, before starting ranks: no rank logs.
  r = run_dtrain("launch --nproc 2 " + cfg + " --resume " + yaml + " --out " + dir / "launched");
  CHECK(r.exit_code == 2);
  CHECK(r.output.starts_with(not_st));
  CHECK_FALSE(std::filesystem::exists(dir / "launched"));
  // --resume auto without checkpoints is a fresh start: the data error comes.
  r = run_dtrain("run " + cfg + " --resume auto --out " + dir / "run");
  CHECK(r.exit_code == 2);
  CHECK(contains(r.output, "bad.csv"));
  // predict checks its --input before loading too.
  const std::string good = dir.write("syn.yaml", kTiny);
  r = run_dtrain("run " + good + " --out " + dir / "good --log-level warn");
  REQUIRE_MESSAGE(r.exit_code == 0, r.output);
  r = run_dtrain("predict " + good + " --checkpoint " + dir / "good --input " + dir / "in.csv");
  CHECK(r.exit_code == 2);
  CHECK(r.output == "error: --input '" + dir / "in.csv" + "' does not exist\n");
}

TEST_CASE("output options are checked before the work, and never replace the checkpoint read") {
  TempDir dir;
  const std::string cfg = dir.write("cfg.yaml", kTiny);
  const std::string sharded = dir / "sharded";
  auto r = run_dtrain("run " + cfg + " --out " + sharded +
                      " --set train.epochs=0 --set train.max_steps=3 --set distributed.world_size=2"
                      " --set distributed.strategy=fsdp --log-level warn");
  REQUIRE_MESSAGE(r.exit_code == 0, r.output);
  const std::string ck = sharded + "/checkpoints";
  // consolidate -o onto the checkpoint it reads, or onto the folder's latest / step entries.
  for (const std::string& o : {ck + "/step-3/rank-0.safetensors", ck + "/step-3/manifest.json",
                               ck + "/latest", ck + "/step-2.safetensors"}) {
    r = run_dtrain("checkpoint consolidate " + sharded + " -o " + o);
    INFO(o << ": " << r.output);
    CHECK(r.exit_code == 2);
    CHECK(contains(r.output, "would replace the checkpoint being read"));
  }
  r = run_dtrain("eval " + cfg + " --checkpoint " + sharded);
  CHECK_MESSAGE(r.exit_code == 0, r.output);  // still intact
  // An existing file that is not a checkpoint (the config, here) is not replaced; a
  // consolidation written before is.
  r = run_dtrain("checkpoint consolidate " + sharded + " -o " + cfg);
  CHECK(r.exit_code == 2);
  CHECK_MESSAGE(contains(r.output, "exists and is not a dtrain checkpoint file"), r.output);
  CHECK(dtrain::testing::read_text(cfg) == kTiny);
  // ... nor is another program's safetensors file (a PyTorch model's weights).
  r = run_dtrain("checkpoint consolidate " + sharded + " -o " +
                 dir.write("pt.safetensors", std::string("\x02\0\0\0\0\0\0\0{}", 10)));
  CHECK_MESSAGE(contains(r.output, "exists and is not a dtrain checkpoint file"), r.output);
  for (int i = 0; i < 2; ++i) {
    r = run_dtrain("checkpoint consolidate " + sharded + " -o " + dir / "one.safetensors");
    CHECK_MESSAGE(r.exit_code == 0, r.output);
  }
  // An empty file (mktemp's) is replaced too; so is a file in a folder that merely has entries
  // named latest (a link to a model version) and manifest.json (a web app's): no checkpoints.
  dir.write("empty.safetensors", "");
  r = run_dtrain("checkpoint consolidate " + sharded + " -o " + dir / "empty.safetensors");
  CHECK_MESSAGE(r.exit_code == 0, r.output);
  dir.write("models/v3/x", "");
  std::filesystem::create_directory_symlink("v3", dir / "models/latest");
  dir.write("models/manifest.json", "{\"name\": \"my app\"}");
  r = run_dtrain("checkpoint consolidate " + sharded + " -o " + dir / "models/v4.safetensors");
  CHECK_MESSAGE(r.exit_code == 0, r.output);
  // Nor a run folder's own files, by any output option.
  for (const std::string& args :
       {"checkpoint consolidate " + sharded + " -o " + sharded + "/summary.json",
        "plot " + sharded + " -o " + sharded + "/metrics.jsonl",
        "predict " + cfg + " --checkpoint " + sharded + " --input " + cfg + " --output " + sharded +
            "/config.json"}) {
    r = run_dtrain(args);
    INFO(args << ": " << r.output);
    CHECK(r.exit_code == 2);
    CHECK(contains(r.output, "would replace the "));
    CHECK(contains(r.output, "of the run in"));
  }
  r = run_dtrain("plot " + sharded + " -o " + sharded + "/loss.svg");  // beside them: fine
  CHECK_MESSAGE(r.exit_code == 0, r.output);
  // The same through a symlink elsewhere (the writes follow it): its target is what is checked.
  const std::string summary_before = dtrain::testing::read_text(sharded + "/summary.json");
  std::filesystem::create_symlink(sharded + "/summary.json", dir / "link.svg");
  std::filesystem::create_symlink(ck + "/step-9.safetensors", dir / "link.safetensors");
  std::filesystem::create_symlink(sharded + "/metrics.jsonl", dir / "link.csv");
  for (const std::string& args :
       {"plot " + sharded + " -o " + dir / "link.svg",
        "checkpoint consolidate " + sharded + " -o " + dir / "link.safetensors",
        "predict " + cfg + " --checkpoint " + sharded + " --input " + cfg + " --output " +
            dir / "link.csv"}) {
    r = run_dtrain(args);
    INFO(args << ": " << r.output);
    CHECK(r.exit_code == 2);
    CHECK(contains(r.output, "(a link to '"));
  }
  CHECK(dtrain::testing::read_text(sharded + "/summary.json") == summary_before);
  // plot replaces an image it could have written, nothing else (the config, here).
  r = run_dtrain("plot " + sharded + " -o " + cfg);
  CHECK(r.exit_code == 2);
  CHECK_MESSAGE(contains(r.output, "exists and is not an SVG or PNG image"), r.output);
  CHECK(dtrain::testing::read_text(cfg) == kTiny);
  r = run_dtrain("plot " + sharded + " -o " + sharded + "/loss.svg");  // its own earlier plot
  CHECK_MESSAGE(r.exit_code == 0, r.output);
  // Folders and missing parents: exit 2 before anything runs.
  r = run_dtrain("checkpoint consolidate " + sharded + " -o " + dir.path());
  CHECK(r.exit_code == 2);
  CHECK(contains(r.output, "is a directory"));
  r = run_dtrain("checkpoint consolidate " + sharded + " -o " + dir / "no/such/x.safetensors");
  CHECK(r.exit_code == 2);
  CHECK(contains(r.output, "which does not exist"));
  r = run_dtrain("run " + cfg + " --out " + dir / "t" + " --trace " + dir / "no/trace.json");
  CHECK(r.exit_code == 2);
  CHECK_FALSE(std::filesystem::exists(dir / "t/summary.json"));  // refused before training
  r = run_dtrain("run " + cfg + " --out " + cfg);
  CHECK(r.exit_code == 2);
  CHECK_MESSAGE(contains(r.output, "is a file, not a folder"), r.output);
  // A folder in which nothing can be created (it was exit 1, "filesystem error: ...").
  r = run_dtrain("run " + cfg + " --out /proc/self");
  CHECK(r.exit_code == 2);
  CHECK_MESSAGE(contains(r.output, "cannot create files in '/proc/self'"), r.output);
  // A result that cannot be written to standard output is a failure, not exit 0.
  r = run_cmd("{ " + kBin + " validate " + cfg + " > /dev/full; }");
  CHECK(r.exit_code == 1);
  CHECK(contains(r.output, "writing to standard output failed"));
}

TEST_CASE("--set takes one KEY=VALUE: the config may come after it") {
  TempDir dir;
  const std::string cfg = dir.write("cfg.yaml", kTiny);
  const auto r = run_dtrain("validate --set seed=4 " + cfg + " --set train.epochs=2");
  CHECK_MESSAGE(r.exit_code == 0, r.output);
  CHECK(contains(r.output, ": ok"));
}

TEST_CASE("an empty file or folder option is refused, not replaced by its default") {
  TempDir dir;
  const std::string cfg = dir.write("cfg.yaml", kTiny);
  const std::string ck = dir / "x.safetensors";
  for (const std::string& args :
       {"run " + cfg + " --out ''", "run " + cfg + " --trace ''", "run " + cfg + " --resume ''",
        "launch --nproc 1 " + cfg + " --out ''", "verify " + cfg + " --out ''",
        "eval " + cfg + " --checkpoint ''",
        "predict " + cfg + " --checkpoint " + ck + " --input ''",
        "predict " + cfg + " --checkpoint " + ck + " --input x.csv --output ''",
        "generate " + cfg + " --checkpoint ''", "checkpoint consolidate " + dir.path() + " -o ''",
        "plot " + dir.path() + " -o ''"}) {
    const auto r = run_dtrain(args);
    INFO(args << ": " << r.output);
    CHECK(r.exit_code == 2);
    CHECK(contains(r.output, "must not be empty"));
  }
}

TEST_CASE("one gRPC rank without a MASTER_PORT picks a free port for its own rendezvous") {
  TempDir dir;
  const std::string cfg = dir.write("cfg.yaml", kTiny);
  const auto r = run_cmd("env -u MASTER_PORT -u MASTER_ADDR -u RANK -u WORLD_SIZE " + kBin +
                         " run " + cfg + " --rank 0 --world-size 1 --no-progress" +
                         " --set distributed.backend=grpc --out " + dir / "one");
  CHECK_MESSAGE(r.exit_code == 0, r.output);  // was: "master port 0 is not in 1..65535"
  CHECK(std::filesystem::exists(dir / "one/summary.json"));
}

TEST_CASE("drop_last with a global batch above the training set: validate refuses as run does") {
  TempDir dir;
  std::string cfg = kTiny;
  cfg.replace(cfg.find("batch_size: 20"), 14, "batch_size: 300\n  drop_last: true");
  const std::string path = dir.write("big_batch.yaml", cfg);
  // 600 samples less the 20% held out by default = 480 training samples; 2 ranks take 600 a step.
  const std::string want =
      "the training set (480 samples) is smaller than one global batch of 600 and "
      "data.drop_last is true";
  auto r = run_dtrain("validate " + path + " --set distributed.world_size=2");
  CHECK(r.exit_code == 2);
  CHECK(contains(r.output, want));
  r = run_dtrain("validate " + path);  // one rank: 300 fit
  CHECK(r.exit_code == 0);
  r = run_dtrain("run " + path + " --set distributed.world_size=2 --out " + dir / "run");
  CHECK(r.exit_code == 2);
  CHECK(contains(r.output, want));
}

TEST_CASE("what run refuses from the data's sizes, labels and features, validate refuses too") {
  TempDir dir;
  const std::string path = dir.write("tiny.yaml", kTiny);
  for (const auto& [set, want] : std::vector<std::pair<std::string, std::string>>{
           // of 600 samples: none
           {" --set data.test_fraction=0.0001",
            "data.test_fraction 0.0001 of the 600 samples holds out none"},
           {" --set data.synthetic.samples=100000000000",
            "(samples + classes) x features = (100000000000 + 3) x 5 is too large"},
           // the class centres count too (32 GiB of them, for 100 samples)
           {" --set data.synthetic.samples=100 --set data.synthetic.classes=1048576 --set "
            "data.synthetic.features=8192",
            "(samples + classes) x features = (100 + 1048576) x 8192 is too large"},
           // labels 0..2: validate took model.num_classes for the data's and said ok
           {" --set model.num_classes=2", "out of range for model.num_classes = 2"},
           {" --set model.input_features=7", "model.input_features is 7 but the data has 5"}}) {
    for (const std::string& cmd : std::vector<std::string>{
             "validate " + path + set, "run " + path + set + " --out " + dir / "r"}) {
      const auto r = run_dtrain(cmd);
      CAPTURE(cmd);
      CHECK(r.exit_code == 2);
      CHECK_MESSAGE(contains(r.output, want), r.output);
    }
  }
  // Synthetic data too large for 4 GB of address space: validate said ok, run was OOM-killed.
  if (dtrain::testing::kUnderSanitizer) return;  // (no ulimit -v there: test_util.h)
  for (const std::string& cmd :
       std::vector<std::string>{"validate " + path, "run " + path + " --out " + dir / "m"}) {
    const auto r =
        run_cmd("ulimit -v 4000000; " + kBin + " " + cmd +
                " --set data.synthetic.samples=1000000000 --set data.synthetic.features=2");
    CAPTURE(cmd);
    CHECK(r.exit_code == 2);
    CHECK_MESSAGE(contains(r.output, "needs about 22.4 GiB to generate"), r.output);
  }
}

TEST_CASE("a label out of range in the test file is named in the test file, with its value") {
  // It was "the training data (data.train) has label 5": each split counts both splits' classes.
  TempDir dir;
  const std::string train = dir.write("train.csv", "a,label\n1,0\n2,1\n3,2\n4,0\n");
  const std::string test = dir.write("test.csv", "a,label\n1,0\n2,5\n");
  const std::string cfg = dir.write(
      "c.yaml", "model: {hidden: [4], num_classes: 3}\ndata: {format: csv, train: {path: " + train +
                    "}, test: {path: " + test + "}, batch_size: 2}\ntrain: {max_steps: 1}\n");
  const auto r = run_dtrain("run " + cfg + " --out " + dir / "r");
  CHECK(r.exit_code == 2);
  CHECK_MESSAGE(contains(r.output,
                         "the test data (data.test) has label 5 (the first out of range "
                         "in data row 2 of '" +
                             test + "'), out of range for model.num_classes = 3"),
                r.output);
}

TEST_CASE("validate refuses the layouts and layer lists run refuses, without reading the data") {
  TempDir dir;
  write_idx(dir, 10);  // 2x2 images, labels 0 and 1
  const std::string cnn = dir.write("cnn.yaml",
                                    "model:\n"
                                    "  type: sequential\n"
                                    "  layers: [flatten, {linear: 2}]\n"
                                    "data:\n"
                                    "  format: idx\n"
                                    "  train: {images: img.idx, labels: lab.idx}\n"
                                    "  batch_size: 2\n"
                                    "train: {epochs: 1}\n");
  const std::string tiny = dir.write("tiny.yaml", kTiny);
  dir.write("text.txt", std::string(4000, 'a'));
  const std::string gpt = dir.write("gpt.yaml",
                                    "model: {type: gpt, n_layer: 1, n_head: 2, n_embd: 16, "
                                    "block_size: 16}\n"
                                    "data: {format: text, train: {path: text.txt}, batch_size: 8}\n"
                                    "optimizer: {type: adamw, lr: 0.001}\n"
                                    "train: {max_steps: 2}\n");
  struct Case {
    std::string args, want;
  };
  for (const Case& c : {
           Case{tiny + " --set distributed.world_size=3 --set distributed.pipeline.stages=2",
                "pipeline stages 2 = 2 does not divide the world size 3"},
           Case{tiny + " --set distributed.strategy=pipeline",
                "pipeline stages 2 = 2 does not divide the world size 1"},
           Case{gpt + " --set distributed.world_size=8 --set distributed.pipeline.stages=8",
                "the model has 4 layer(s) with parameters, fewer than 8 stages"},
           Case{cnn + " --set 'model.layers=[{conv2d: {out_channels: 4, kernel: 3}}, flatten, "
                      "{linear: 2}]'",
                "model.layers[0] (conv2d): kernel 3x3 is larger than the padded input 2x2"},
           Case{cnn + " --set 'model.layers=[flatten, {linear: 3}]'",
                "the last layer gives [3] per sample, but the data has 2 classes"},
       }) {
    CAPTURE(c.args);
    auto r = run_dtrain("validate " + c.args);
    CHECK(r.exit_code == 2);
    CHECK_MESSAGE(contains(r.output, c.want), r.output);
  }
  CHECK(run_dtrain("validate " + cnn).exit_code == 0);
  // An IDX header of 0-pixel images, or of images past int64 once multiplied out: refused as
  // run refuses them, or left to run (was: SIGFPE, or an internal CHECK, exit 1).
  dir.write("img0.idx", be32(0x803) + be32(2) + be32(0) + be32(4));
  dir.write("imgbig.idx", be32(0x803) + be32(1) + be32(0xffffffffu) + be32(0xffffffffu));
  for (const char* img : {"img0.idx", "imgbig.idx"})
    for (const char* layers : {"[flatten, {linear: 2}]", "[layer_norm, flatten, {linear: 2}]"}) {
      CAPTURE(img);
      CAPTURE(layers);
      const auto r = run_dtrain("validate " + cnn + " --set data.train.images=" + (dir / img) +
                                " --set 'model.layers=" + layers + "'");
      CHECK_FALSE(contains(r.output, "internal error"));
      CHECK(r.exit_code != 1);
      CHECK(r.exit_code < 128);  // no signal
      if (std::string(img) == "img0.idx")
        CHECK_MESSAGE(contains(r.output, "has images of 0 pixels (0x4)"), r.output);
    }
  // Synthetic labels are i % classes: 5 samples of "8 classes" have 5, as run counts them.
  const std::string few =
      dir.write("few.yaml",
                "model: {type: sequential, layers: [{linear: 5}]}\n"
                "data: {format: synthetic, synthetic: {samples: 5, features: 4, classes: 8}, "
                "batch_size: 5}\n"
                "train: {max_steps: 1}\n");
  auto v = run_dtrain("validate " + few);
  CHECK_MESSAGE(v.exit_code == 0, v.output);
  v = run_dtrain("validate " + few + " --set 'model.layers=[{linear: 8}]'");
  CHECK_MESSAGE(contains(v.output, "the data has 5 classes"), v.output);
  // Launched ranks get their world size from the launcher: a gRPC config's grid is run's to judge.
  CHECK(run_dtrain("validate " + tiny + " --set distributed.backend=grpc --set " +
                   "distributed.strategy=pipeline")
            .exit_code == 0);
}

TEST_CASE("validate refuses the IDX files run refuses from their headers and sizes") {
  // A wrong magic, a header whose shape the file does not hold, an empty file: validate said ok.
  TempDir dir;
  const auto be32 = [](uint32_t v) {
    return std::string{static_cast<char>(v >> 24), static_cast<char>(v >> 16),
                       static_cast<char>(v >> 8), static_cast<char>(v)};
  };
  const std::string labels = dir.write("labels.idx", be32(0x801) + be32(4) + std::string(4, '\1'));
  const std::string good = be32(0x803) + be32(4) + be32(2) + be32(2) + std::string(16, '\7');
  dir.write("good.idx", good);
  dir.write("magic.idx", be32(0x802) + good.substr(4));
  dir.write("short.idx", be32(0x803) + be32(60) + be32(4) + be32(4) + std::string(100, '\0'));
  dir.write("empty.idx", "");
  // Whole headers that still do not go together: 5 images for 4 labels, no images, and test
  // images of another size (5x5) or shape (1x4) than the training ones (validate said ok).
  dir.write("five.idx", be32(0x803) + be32(5) + be32(2) + be32(2) + std::string(20, '\7'));
  dir.write("none.idx", be32(0x803) + be32(0) + be32(2) + be32(2));
  dir.write("nolabels.idx", be32(0x801) + be32(0));
  dir.write("big.idx", be32(0x803) + be32(4) + be32(5) + be32(5) + std::string(100, '\7'));
  dir.write("flat.idx", be32(0x803) + be32(4) + be32(1) + be32(4) + std::string(16, '\7'));
  const std::string cfg =
      dir.write("idx.yaml",
                "model: {hidden: [4]}\ndata: {format: idx, train: {images: good.idx, labels: "
                "labels.idx}, batch_size: 2}\ntrain: {max_steps: 1}\n");
  CmdResult r = run_dtrain("validate " + cfg);
  CHECK_MESSAGE(r.exit_code == 0, r.output);
  for (const auto& [file, part] : std::vector<std::pair<std::string, std::string>>{
           {"magic.idx", "holds unsigned byte values of 2 dimension(s) (magic 0x00000802)"},
           {"short.idx", "size mismatch: header says 60x4x4"},
           {"empty.idx", "is too short (0 bytes) to hold a header"},
           {"five.idx", "has 5 images but labels file"},
           {"none.idx --set data.train.labels=" + dir / "nolabels.idx", "has 0 images"},
           {"good.idx --set data.test.images=" + dir / "big.idx" +
                " --set data.test.labels=" + dir / "labels.idx",
            "has 25 features but the training set has 4"},
           {"good.idx --set data.test.images=" + dir / "flat.idx" +
                " --set data.test.labels=" + dir / "labels.idx",
            "are [1, 1, 4], the training images [1, 2, 2]"}}) {
    const std::vector<std::string> cmds = {"validate ", "run --out " + dir / "r" + " "};
    for (const std::string& cmd : cmds) {
      r = run_dtrain(cmd + cfg + " --set data.train.images=" + dir / file);
      INFO(cmd << file << ": " << r.output);
      CHECK(r.exit_code == 2);
      CHECK(contains(r.output, part));
    }
  }
}
