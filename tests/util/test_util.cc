#include <doctest/doctest.h>

#include <stdlib.h>
#include <sys/stat.h>
#include <sys/sysmacros.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cmath>
#include <csignal>
#include <filesystem>
#include <limits>
#include <set>
#include <thread>
#include <vector>

#include "test_util.h"
#include "util/check.h"
#include "util/duration.h"
#include "util/fs.h"
#include "util/interrupt.h"
#include "util/rng.h"
#include "util/strings.h"

using namespace dtrain;

TEST_CASE("Rng is deterministic, serialisable and streams differ") {
  Rng a(42), b(42), c(43);
  for (int i = 0; i < 10; ++i) CHECK(a.next_u64() == b.next_u64());
  CHECK(Rng(42).next_u64() != c.next_u64());
  CHECK(Rng(1, 0).next_u64() != Rng(1, 1).next_u64());

  Rng r(7);
  r.next_u64();
  Rng s;
  s.from_string(r.to_string());
  for (int i = 0; i < 5; ++i) CHECK(r.next_u64() == s.next_u64());
  CHECK_THROWS_AS(s.from_string("zz"), UserError);
  CHECK_THROWS_AS(s.from_string("1,2,3"), UserError);
  CHECK_THROWS_AS(s.from_string("1,2,3,4,5"), UserError);
  CHECK_THROWS_AS(s.from_string("1,2,3,4x"), UserError);
}

TEST_CASE("Rng distributions") {
  Rng r(3);
  double sum = 0, sq = 0;
  const int n = 20000;
  std::set<uint64_t> seen;
  for (int i = 0; i < n; ++i) {
    const float u = r.uniform();
    REQUIRE(u >= 0.0f);
    REQUIRE(u < 1.0f);
    const float z = r.normal();
    sum += z;
    sq += z * z;
    const uint64_t k = r.below(7);
    REQUIRE(k < 7);
    seen.insert(k);
  }
  CHECK(seen.size() == 7);
  CHECK(std::abs(sum / n) < 0.05);
  CHECK(std::abs(sq / n - 1.0) < 0.05);
}

TEST_CASE("DT_CHECK reports file, line and both values") {
  try {
    DT_CHECK_EQ(1 + 1, 3);
    FAIL("no throw");
  } catch (const InternalError& e) {
    const std::string msg = e.what();
    CHECK(msg.find("test_util.cc:") != std::string::npos);
    CHECK(msg.find("(2 vs 3)") != std::string::npos);
  }
}

TEST_CASE("write_file_atomic replaces whole files and keeps the old one on failure") {
  const testing::TempDir dir;
  const std::string path = dir / "f.txt";
  write_file_atomic(path, "first");
  CHECK(read_file(path) == "first");
  write_file_atomic(path, "second");
  CHECK(read_file(path) == "second");
  CHECK_THROWS(write_file_atomic_with(path, [](int fd) {
    write_all(fd, "partial", 7, "x");
    throw std::runtime_error("disk full");
  }));
  CHECK(read_file(path) == "second");
  // No temp files left behind.
  int files = 0;
  for (auto& e : std::filesystem::directory_iterator(dir.path())) files += e.is_regular_file();
  CHECK(files == 1);
  CHECK_THROWS_AS(read_file(dir / "missing"), UserError);
}

TEST_CASE("write_file_atomic: a new file's mode follows the umask, a replaced file keeps its own") {
  // Every file was 0644 whatever the umask (checkpoints world-readable under umask 077) and a
  // 0600 file it replaced became 0644.
  const testing::TempDir dir;
  const auto mode = [](const std::string& p) {
    struct stat st {};
    REQUIRE(::stat(p.c_str(), &st) == 0);
    return st.st_mode & 07777;
  };
  const mode_t old_mask = ::umask(077);
  write_file_atomic(dir / "private", "x");
  ::umask(022);
  write_file_atomic(dir / "shared", "x");
  ::umask(old_mask);
  CHECK(mode(dir / "private") == 0600);
  CHECK(mode(dir / "shared") == 0644);
  REQUIRE(::chmod((dir / "shared").c_str(), 0640) == 0);
  write_file_atomic(dir / "shared", "y");
  CHECK(mode(dir / "shared") == 0640);
  CHECK(read_file(dir / "shared") == "y");
}

TEST_CASE("a stop signal during write_file_atomic ends the process and leaves no temp file") {
  // Ctrl-C or SIGTERM during `checkpoint consolidate` left its hidden temp file (hundreds of MB)
  // behind for good. The child below is that process, signalled mid-write.
  const testing::TempDir dir;
  for (const int sig : {SIGINT, SIGTERM, SIGHUP}) {
    const pid_t pid = ::fork();
    REQUIRE(pid >= 0);
    if (pid == 0) {
      end_by_stop_signals_removing_temp_files();
      write_file_atomic_with(dir / "out.safetensors", [sig](int fd) {
        write_all(fd, "partial", 7, "x");
        ::raise(sig);
      });
      ::_exit(0);  // (not reached)
    }
    int status = 0;
    REQUIRE(::waitpid(pid, &status, 0) == pid);
    CHECK(WIFSIGNALED(status));
    CHECK(WTERMSIG(status) == sig);
    CHECK(std::filesystem::is_empty(dir.path()));
  }
}

TEST_CASE("write_file_atomic writes through symlinks and into devices and FIFOs, never over them") {
  namespace fs = std::filesystem;
  const testing::TempDir dir;
  const fs::path d(dir.path());
  // A symlink: the file it names gets the bytes, the link stays a link.
  write_file_atomic((d / "real.txt").string(), "old");
  fs::create_symlink("real.txt", d / "link.txt");
  CHECK(output_file_problem((d / "link.txt").string()).empty());
  write_file_atomic((d / "link.txt").string(), "new");
  CHECK(fs::is_symlink(d / "link.txt"));
  CHECK(read_file((d / "real.txt").string()) == "new");
  // A dangling symlink: its target is created.
  fs::create_symlink("made.txt", d / "dangling.txt");
  write_file_atomic((d / "dangling.txt").string(), "made");
  CHECK(fs::is_symlink(d / "dangling.txt"));
  CHECK(read_file((d / "made.txt").string()) == "made");
  // A FIFO: its reader receives the bytes; it stays a FIFO.
  const std::string fifo = (d / "fifo").string();
  REQUIRE(::mkfifo(fifo.c_str(), 0600) == 0);
  CHECK(output_file_problem(fifo).empty());
  std::string got;
  std::thread reader([&] { got = read_file(fifo); });
  write_file_atomic(fifo, "through the pipe");
  reader.join();
  CHECK(got == "through the pipe");
  CHECK(fs::is_fifo(fifo));
  // A character device node (the null device, made here; needs root, as CI runs): written into,
  // still a device afterwards. Renaming over it is how `--trace /dev/null` destroyed /dev/null.
  const std::string dev = (d / "null").string();
  if (::mknod(dev.c_str(), S_IFCHR | 0666, makedev(1, 3)) == 0) {
    write_file_atomic(dev, "discarded");
    CHECK(fs::is_character_file(dev));
  } else {
    MESSAGE("mknod not permitted here: the device case is skipped");
  }
  // Nothing else was left in the folder (no temp files).
  std::set<std::string> names;
  for (const auto& e : fs::directory_iterator(d)) names.insert(e.path().filename().string());
  CHECK(names.size() == (fs::exists(dev) ? 6u : 5u));
}

TEST_CASE("LineWriter appending cuts an unfinished last line, and only that") {
  const testing::TempDir dir;
  const std::string path = dir / "m.jsonl";
  const std::string long_line(10000, 'x');  // spans blocks of the backwards search
  struct Case {
    std::string before, after;
    size_t dropped;
  };
  for (const Case& c : std::vector<Case>{{"", "", 0},
                                         {"a\nb\n", "a\nb\n", 0},
                                         {"a\nb\n{\"lo", "a\nb\n", 4},
                                         {"{\"kind", "", 6},
                                         {"a\n" + long_line, "a\n", 10000},
                                         {long_line + "\n" + long_line, long_line + "\n", 10000},
                                         {long_line + "\n", long_line + "\n", 0}}) {
    CAPTURE(c.before.size());
    write_file_atomic(path, c.before);
    {
      LineWriter w(path, /*append=*/true);
      CHECK(w.dropped_bytes() == c.dropped);
      w.write_line("{\"step\":2}");
    }
    CHECK(read_file(path) == c.after + "{\"step\":2}\n");
  }
  // Not appending: the file starts over; a missing file is created.
  { LineWriter w(path, false); }
  CHECK(read_file(path).empty());
  std::filesystem::remove(path);
  {
    LineWriter w(path, true);
    CHECK(w.dropped_bytes() == 0);
  }
  CHECK(std::filesystem::exists(path));
}

TEST_CASE("LineWriter: a write that fails (a full disk) throws, naming the file and the cause") {
  // Before, fwrite/fflush results were ignored: a run on a full disk lost its metrics records
  // silently and exited 0.
  LineWriter w("/dev/full", /*append=*/false);
  CHECK_THROWS_WITH_AS(w.write_line("{\"step\":1}"),
                       doctest::Contains("writing '/dev/full' failed: No space left on device"),
                       std::runtime_error);
}

TEST_CASE("input_file_problem: /proc and /sys files are not data (size 0, endless reads)") {
  // /proc/self/pagemap passed as text data: stat says 0 bytes, a read yields hundreds of GB.
  for (const std::string p : {"/proc/self/pagemap", "/proc/cpuinfo"}) {
    CAPTURE(p);
    CHECK(input_file_problem(p) == "is a kernel interface file (/proc, /sys), not data");
  }
  const testing::TempDir dir;
  CHECK(input_file_problem(dir.write("data.txt", "data\n")).empty());
  CHECK(input_file_problem("/nonexistent-dtrain-file") == "does not exist");
}

TEST_CASE("fnv1a_hex is the 64-bit FNV-1a") {
  CHECK(fnv1a_hex("") == "cbf29ce484222325");
  CHECK(fnv1a_hex("a") == "af63dc4c8601ec8c");
  CHECK(peak_rss_mb() > 0.0);
}

TEST_CASE("UserError shows control characters from user input escaped, keeping newlines") {
  using namespace std::string_literals;
  CHECK(std::string(UserError("got 'ml\0p'"s).what()) == "got 'ml\\0p'");
  CHECK(std::string(UserError("a\x1b[31mb\x7f"s).what()) == "a\\x1b[31mb\\x7f");
  CHECK(std::string(UserError("one\ntwo\tthree").what()) == "one\ntwo\tthree");
  CHECK(std::string(UserError("caf\xc3\xa9").what()) == "caf\xc3\xa9");  // UTF-8 stays
}

TEST_CASE(
    "timeouts in seconds saturate: too large for the clock means a far deadline, not a past one") {
  using std::chrono::steady_clock;
  CHECK(seconds_duration(1.5) == std::chrono::milliseconds(1500));
  CHECK(seconds_duration(0) == steady_clock::duration::zero());
  CHECK(seconds_duration(-3) == steady_clock::duration::zero());
  CHECK(seconds_duration(std::nan("")) == steady_clock::duration::zero());
  // 1e10 s is past steady_clock's int64 nanoseconds (about 9.2e9 s): a wrapped conversion gave a
  // deadline in the past, so a run with distributed.timeout_s 1e10 failed at its first collective.
  const auto now = steady_clock::now();
  for (double s : {1e10, 1e300, std::numeric_limits<double>::infinity()}) {
    CAPTURE(s);
    CHECK(seconds_duration(s) == seconds_duration(kMaxWaitSeconds));
    CHECK(deadline_in(s) > now + std::chrono::hours(24 * 365 * 30));
  }
}

TEST_CASE("read_regular_file refuses FIFOs, devices and folders at once, and caps the size") {
  const std::string dir = "/tmp/dtrain_rrf_" + std::to_string(::getpid());
  std::filesystem::create_directories(dir);
  const std::string fifo = dir + "/fifo";
  REQUIRE(::mkfifo(fifo.c_str(), 0600) == 0);
  const std::string file = dir + "/f";
  dtrain::write_file_atomic(file, "0123456789");
  const auto error = [](const std::string& path, uint64_t max) {
    try {
      dtrain::read_regular_file(path, max);
    } catch (const dtrain::UserError& e) {
      return std::string(e.what());
    }
    return std::string("<read>");
  };
  CHECK(error(fifo, 100) == "'" + fifo + "' is not a regular file");  // no writer: no wait
  CHECK(error("/dev/zero", 100) == "'/dev/zero' is not a regular file");
  CHECK(error(dir, 100) == "'" + dir + "' is not a regular file");
  CHECK(error(file, 9) == "'" + file + "' is larger than the 9 bytes such a file holds");
  CHECK(dtrain::read_regular_file(file, 10) == "0123456789");
  std::filesystem::remove_all(dir);
}

TEST_CASE("shown_text and bounded_message keep messages short, cut at character boundaries") {
  CHECK(dtrain::shown_text("abc") == "abc");
  CHECK(dtrain::shown_text("a\x01"
                           "b") == "a?b");
  // 59 ASCII bytes then a 2-byte character across the 60-byte mark: cut before it.
  const std::string s = std::string(59, 'a') + "\xc3\xa9" + std::string(100, 'b');
  CHECK(dtrain::shown_text(s) == std::string(59, 'a') + "... (161 bytes)");
  CHECK(dtrain::bounded_message("short") == "short");
  std::string big;
  for (int i = 0; i < 10000; ++i) big += "\xe2\x82\xac";  // 30000 bytes of 3-byte characters
  const std::string m = dtrain::bounded_message(big, 1000);
  CHECK(m.size() < 1100);
  CHECK(m.find(" bytes left out ...] ") != std::string::npos);
  CHECK(dtrain::valid_utf8(m));
  CHECK(m.starts_with("\xe2\x82\xac"));
  CHECK(m.ends_with("\xe2\x82\xac"));
}

TEST_CASE("path_is_within: a folder that cannot be resolved holds nothing") {
  dtrain::testing::TempDir dir;
  namespace fs = std::filesystem;
  fs::create_directories(dir / "runs/a/checkpoints");
  CHECK(
      path_is_within(dir / "runs/a/checkpoints/step-4.safetensors", dir / "runs/a/./checkpoints"));
  CHECK_FALSE(path_is_within(dir / "runs/b", dir / "runs/a"));
  // A loop of symbolic links: it resolved to nothing, and nothing "contained" /etc/passwd.
  fs::create_symlink(dir / "loop2", dir / "loop1");
  fs::create_symlink(dir / "loop1", dir / "loop2");
  CHECK_FALSE(path_is_within("/etc/passwd", dir / "loop1/x"));
}

TEST_CASE("json_error_text drops the JSON library's bracketed tag, and only that") {
  CHECK(dtrain::json_error_text("[json.exception.type_error.302] type must be number, but is "
                                "null") == "type must be number, but is null");
  CHECK(dtrain::json_error_text("[json.exception.parse_error.101] parse error at line 1") ==
        "parse error at line 1");
  CHECK(dtrain::json_error_text("key 'x' not found") == "key 'x' not found");
  CHECK(dtrain::json_error_text("[json.exception.oops") == "[json.exception.oops");
}
