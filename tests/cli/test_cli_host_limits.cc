// Host limits a rank meets. A /dev/shm without room for the shared-memory rings (a container's
// 64 MB default filled by other programs): the ranks carry their data over their gRPC streams
// and say why; they were killed by SIGBUS at their first write into a ring, with nothing said,
// every restart alike. An open-file limit too low for the job's connections.
#include <arpa/inet.h>
#include <doctest/doctest.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <filesystem>
#include <string>
#include <thread>
#include <vector>

#include "launch/launcher.h"
#include "test_util.h"

using dtrain::testing::contains;
using dtrain::testing::read_text;
using dtrain::testing::run_cmd;
using dtrain::testing::TempDir;

namespace {
const std::string kBin = DTRAIN_BIN;

// `dtrain run CFG --out OUT` with its console (standard output and error) piped into the shell
// command `reader`; the run's own result.
dtrain::testing::CmdResult run_into(const std::string& cfg, const std::string& out,
                                    const std::string& reader) {
  return run_cmd("bash -c '" + kBin + " run " + cfg + " --out " + out + " --no-progress 2>&1 | " +
                 reader + "; exit ${PIPESTATUS[0]}'");
}
}  // namespace

TEST_CASE("a full /dev/shm: the ranks use their gRPC streams and say so, no SIGBUS") {
  if (run_cmd("unshare -m true").exit_code != 0) {
    MESSAGE("skipped: cannot make a mount namespace here (unshare -m needs root)");
    return;
  }
  TempDir dir;
  const std::string cfg = dir.write(
      "c.yaml",
      "model: {hidden: [256, 256]}\ndata: {format: synthetic, synthetic: {samples: 400, features: "
      "64, classes: 3}, batch_size: 16}\ntrain: {epochs: 0, max_steps: 20}\n"
      "distributed: {backend: grpc, world_size: 2}\nruntime: {threads: 1}\n");
  // 1 MiB free: room for the segments' control blocks, not for a ring of 4 MiB, which 20 steps'
  // gradients (330 KB each) go all through
  const auto r = run_cmd(
      "unshare -m sh -c 'mount -t tmpfs -o size=8m tmpfs /dev/shm && dd "
      "if=/dev/zero of=/dev/shm/other bs=1M count=7 2>/dev/null && exec " +
      kBin + " launch --nproc 2 " + cfg + " --out " + dir / "run" + "' > " + dir / "log" +
      " 2>&1; echo rc $?");
  const std::string log = read_text(dir / "log");
  CHECK_MESSAGE(contains(r.output, "rc 0"), log);
  CHECK_FALSE(contains(log, "SIGBUS"));
  CHECK_MESSAGE(contains(log,
                         "no shared memory to rank 1, using its gRPC stream: no room in "
                         "/dev/shm/dtrain-"),
                log);
}

TEST_CASE("an open-file limit too low for the job is raised to the hard limit, else refused") {
  // 4 descriptors per peer: too few made every rank fail after its timeouts, blaming a healthy
  // peer ("no heartbeat from rank 3: frozen") or MASTER_ADDR.
  TempDir dir;
  const std::string cfg = dir.write(
      "c.yaml",
      "model: {hidden: [8]}\ndata: {format: synthetic, synthetic: {samples: 200, features: 4, "
      "classes: 3}, batch_size: 8}\ntrain: {epochs: 0, max_steps: 5}\n"
      "distributed: {backend: grpc, world_size: 3}\nruntime: {threads: 1}\n");
  const std::string launch =
      "exec " + kBin + " launch --nproc 3 " + cfg + " --out " + dir / "run" + " --overwrite";
  // Both limits 40 (a rank of 3 needs 76): refused at once, exit 2, naming the limit.
  auto r = run_cmd("bash -c 'ulimit -n 40; " + launch + "' 2>&1");
  CHECK_MESSAGE(r.exit_code == 2, r.output);
  CHECK_MESSAGE(contains(r.output,
                         "the open-file limit (ulimit -n) is 40, and a rank of a job of "
                         "3 ranks needs about 76 descriptors"),
                r.output);
  // The soft limit alone: raised, and the job trains.
  r = run_cmd("bash -c 'ulimit -Sn 40; " + launch + "' 2>&1");
  CHECK_MESSAGE(r.exit_code == 0, r.output);
}

TEST_CASE("a silent connection to the rendezvous port is closed after 10 s, not 120 s") {
  // Any host that reaches MASTER_PORT may connect without the token: 1,100 silent connections
  // held a descriptor each for gRPC's default two minutes, and the run failed writing its
  // checkpoint ("Too many open files").
  TempDir dir;
  const std::string cfg = dir.write(
      "c.yaml",
      "model: {hidden: [8]}\ndata: {format: synthetic, synthetic: {samples: 200, features: 4, "
      "classes: 3}, batch_size: 8}\ntrain: {epochs: 0, max_steps: 5}\n"
      "distributed: {backend: grpc, world_size: 2, rendezvous_timeout_s: 60}\n"
      "runtime: {threads: 1}\n");
  const int port = dtrain::pick_free_port();
  // Rank 0 alone: it serves the rendezvous while it waits for rank 1. The probe (bash's
  // /dev/tcp) connects once the port listens, sends nothing, and reads until the server closes.
  const std::string p = std::to_string(port);
  const std::string probe =
      "for i in $(seq 300); do exec 3<>/dev/tcp/127.0.0.1/" + p +
      " && break; sleep 0.1; done 2>/dev/null\n"
      "t=$(date +%s); timeout 60 cat <&3 >/dev/null; rc=$?\n"
      "if [ $rc = 124 ]; then echo 'still open after 60 s'; else echo \"closed after $(( $(date "
      "+%s) - t )) s\"; fi\n";
  dir.write("probe.sh", probe);
  const auto r =
      run_cmd("RANK=0 WORLD_SIZE=2 MASTER_ADDR=127.0.0.1 MASTER_PORT=" + p + " timeout 60 " + kBin +
              " run " + cfg + " --out " + dir / "run" + " > " + dir / "r0.log" +
              " 2>&1 & p=$!; bash " + dir / "probe.sh" + "; kill $p; wait $p");
  // (10 s on an idle machine; the point is: not gRPC's 120 s)
  const size_t at = r.output.find("closed after ");
  REQUIRE_MESSAGE(at != std::string::npos, r.output);
  const int secs = std::stoi(r.output.substr(at + 13));
  CHECK_MESSAGE((secs >= 3 && secs <= 40), r.output);
}

TEST_CASE("a rank whose rendezvous port never answers says who is there, if anyone") {
  // A rank given another program's port (or one nobody listens on) said "timed out" alone.
  TempDir dir;
  const std::string cfg = dir.write(
      "c.yaml",
      "model: {hidden: [8]}\ndata: {format: synthetic, synthetic: {samples: 200, features: 4, "
      "classes: 3}, batch_size: 8}\ntrain: {epochs: 0, max_steps: 5}\n"
      "distributed: {backend: grpc, world_size: 2, rendezvous_timeout_s: 1}\n"
      "runtime: {threads: 1}\n");
  // A listener that accepts (the kernel does) and never speaks, as a foreign program would not.
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  REQUIRE(fd >= 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof(a);
  REQUIRE(::bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof(a)) == 0);
  REQUIRE(::listen(fd, 8) == 0);
  REQUIRE(::getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len) == 0);
  const int busy = ntohs(a.sin_port);
  // (accepted and held, as a foreign server does: a full backlog would drop the probe's connect)
  std::thread acceptor([fd] {
    std::vector<int> held;
    for (int c; (c = ::accept(fd, nullptr, nullptr)) >= 0;) held.push_back(c);
    for (const int c : held) ::close(c);
  });
  const auto rank1 = [&](int port) {
    return run_cmd("RANK=1 WORLD_SIZE=2 MASTER_ADDR=127.0.0.1 MASTER_PORT=" + std::to_string(port) +
                   " " + kBin + " run " + cfg + " --out " + dir / "run" + " 2>&1");
  };
  auto r = rank1(busy);
  CHECK(r.exit_code == 1);
  CHECK_MESSAGE(contains(r.output, "something listens at 127.0.0.1:" + std::to_string(busy) +
                                       " but never answered as a dtrain rendezvous"),
                r.output);
  ::shutdown(fd, SHUT_RDWR);  // (ends the acceptor's accept)
  acceptor.join();
  ::close(fd);
  r = rank1(dtrain::pick_free_port());
  CHECK(r.exit_code == 1);
  CHECK_MESSAGE(contains(r.output, ": rank 0 is not running there"), r.output);
}

TEST_CASE("a console that goes away and a file-size limit: a said failure or a finished run") {
  TempDir dir;
  const std::string cfg = dir.write(
      "c.yaml",
      "model: {hidden: [64, 64]}\ndata: {format: synthetic, synthetic: {samples: 400, features: "
      "16, classes: 3}, batch_size: 8}\ntrain: {epochs: 0, max_steps: 400, log_every: 1, "
      "checkpoint: {every_steps: 100}}\nruntime: {threads: 1}\n");
  // The reader of the run's console stops reading after 10 bytes (`| head`, a tee whose ssh
  // session dropped): SIGPIPE ended the run with no checkpoint or summary; it finishes.
  const auto piped = run_into(cfg, dir / "p", "head -c 10 > /dev/null");
  CHECK_MESSAGE(piped.exit_code == 0, piped.output);
  CHECK(contains(read_text(dir / "p/summary.json"), "\"status\": \"completed\""));
  // A checkpoint past `ulimit -f` (its 100 steps' worth is about 60 KB): one error line, exit 1,
  // no temp file left (SIGXFSZ ended it with nothing said).
  const auto limited = run_cmd("bash -c 'ulimit -f 40; " + kBin + " run " + cfg + " --out " +
                               dir / "f" + " --no-progress'");
  CHECK(limited.exit_code == 1);
  CHECK_MESSAGE(contains(limited.output, "failed: File too large"), limited.output);
  if (std::filesystem::exists(dir / "f/checkpoints"))
    for (const auto& e : std::filesystem::directory_iterator(dir / "f/checkpoints"))
      CHECK_MESSAGE(!e.path().filename().string().starts_with("."), e.path());
}

TEST_CASE("in-process ranks train on while their console's reader does not read") {
  // `dtrain run ... 2>&1 | less`, not scrolled: rank 0 blocked writing its log into the full
  // pipe, and rank 1's collective timed out (distributed.timeout_s). Lines now wait 2 s at most,
  // then are dropped and counted.
  TempDir dir;
  const std::string cfg = dir.write(
      "c.yaml",
      "model: {hidden: [16]}\ndata: {format: synthetic, synthetic: {samples: 400, features: 8, "
      "classes: 3}, batch_size: 8}\ntrain: {epochs: 0, max_steps: 3000, log_every: 1}\n"
      "distributed: {world_size: 2, timeout_s: 6}\nruntime: {threads: 1}\n");
  const auto r = run_into(cfg, dir / "r", "(sleep 10; cat > " + dir / "console" + ")");
  CHECK_MESSAGE(r.exit_code == 0, r.output);
  const std::string console = read_text(dir / "console");
  CHECK(contains(console, "bytes of log did not fit the console"));
  CHECK(contains(console, "done: test accuracy"));
  CHECK(contains(read_text(dir / "r/summary.json"), "\"status\": \"completed\""));
}
