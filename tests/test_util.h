// Shared helpers for the test suites: temp folders and running the dtrain binary.
#pragma once

#include <arpa/inet.h>
#include <netinet/in.h>
#include <stdlib.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <array>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <random>
#include <stdexcept>
#include <string>
#include <vector>

namespace dtrain::testing {

// Under AddressSanitizer or ThreadSanitizer (scripts/sanitize.sh): a process under `ulimit -v`
// dies before main (they reserve terabytes of shadow address space at start), and operator new
// aborts instead of throwing std::bad_alloc. Tests of either are skipped there
// (`TEST_CASE(... * doctest::skip(kUnderSanitizer))`).
#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
inline constexpr bool kUnderSanitizer = true;
#elif defined(__has_feature)
#if __has_feature(address_sanitizer) || __has_feature(thread_sanitizer)
inline constexpr bool kUnderSanitizer = true;
#else
inline constexpr bool kUnderSanitizer = false;
#endif
#else
inline constexpr bool kUnderSanitizer = false;
#endif

// A fresh folder under /tmp, removed when the object goes out of scope.
class TempDir {
 public:
  TempDir() {
    char tmpl[] = "/tmp/dtrain_test_XXXXXX";
    if (mkdtemp(tmpl) == nullptr) throw std::runtime_error("mkdtemp failed");
    path_ = tmpl;
  }
  ~TempDir() {
    std::error_code ec;
    std::filesystem::remove_all(path_, ec);
  }
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;
  const std::string& path() const { return path_; }
  std::string operator/(const std::string& name) const { return path_ + "/" + name; }
  std::string write(const std::string& name, const std::string& text) const {
    // Creates the folders `name` passes through (a test writing step-5/manifest.json means a
    // step-5 folder; without them the write failed silently and the test checked nothing).
    const std::string p = *this / name;
    std::filesystem::create_directories(std::filesystem::path(p).parent_path());
    std::ofstream out(p, std::ios::binary);
    out << text;
    if (!out.flush()) throw std::runtime_error("TempDir::write: cannot write " + p);
    return p;
  }

 private:
  std::string path_;
};

struct CmdResult {
  int exit_code = -1;  // -1 when killed by a signal
  int signal = 0;
  std::string output;  // stdout and stderr together
};

// Runs a shell command line, capturing both streams.
inline CmdResult run_cmd(const std::string& cmd) {
  CmdResult r;
  FILE* p = popen((cmd + " 2>&1").c_str(), "r");
  if (!p) return r;
  std::array<char, 4096> buf;
  size_t n;
  while ((n = fread(buf.data(), 1, buf.size(), p)) > 0) r.output.append(buf.data(), n);
  const int status = pclose(p);
  if (WIFEXITED(status)) r.exit_code = WEXITSTATUS(status);
  if (WIFSIGNALED(status)) r.signal = WTERMSIG(status);
  return r;
}

// Big-endian 32-bit words, as IDX headers store them.
inline std::string be32(uint32_t v) {
  return {static_cast<char>(v >> 24), static_cast<char>(v >> 16), static_cast<char>(v >> 8),
          static_cast<char>(v)};
}

// A loopback port nobody listens on right now, for a test's rendezvous. Picked at random below
// the kernel's ephemeral range (net.ipv4.ip_local_port_range, default 32768-60999) and checked
// by binding it: a port from bind(0) comes from that range, which every outgoing connection of
// the tests running in parallel also draws from, so one of them could take it before the test
// listens on it ("Address already in use", seen in CI). Falls back to bind(0) when the range
// starts too low to leave room below it. Tests never use fixed ports.
inline int free_port() {
  auto try_bind = [](int port) {
    const int fd = socket(AF_INET, SOCK_STREAM, 0);
    if (fd < 0) throw std::runtime_error("socket() failed");
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    a.sin_port = htons(static_cast<uint16_t>(port));
    socklen_t len = sizeof(a);
    const bool ok = bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof(a)) == 0 &&
                    getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len) == 0;
    close(fd);
    return ok ? ntohs(a.sin_port) : -1;
  };
  int low = 32768;
  if (std::ifstream range("/proc/sys/net/ipv4/ip_local_port_range"); range) range >> low;
  constexpr int kSpan = 12000;
  if (low > kSpan + 1024) {
    static thread_local std::mt19937 rng(std::random_device{}() ^ static_cast<unsigned>(getpid()));
    std::uniform_int_distribution<int> pick(low - kSpan, low - 1);
    for (int i = 0; i < 64; ++i)
      if (const int p = try_bind(pick(rng)); p > 0) return p;
  }
  const int p = try_bind(0);
  if (p < 0) throw std::runtime_error("cannot bind a loopback port");
  return p;
}

// Another process's listener, as far as a dtrain started by the test can tell: a loopback socket
// listening on a free port (free_port()) until destroyed.
class HeldPort {
 public:
  HeldPort() : port_(free_port()), fd_(::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0)) {
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_port = htons(static_cast<uint16_t>(port_));
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    if (fd_ < 0 || ::bind(fd_, reinterpret_cast<sockaddr*>(&a), sizeof a) != 0 ||
        ::listen(fd_, 1) != 0) {
      if (fd_ >= 0) ::close(fd_);  // (a throwing constructor runs no destructor)
      throw std::runtime_error("cannot listen on port " + std::to_string(port_));
    }
  }
  ~HeldPort() {
    if (fd_ >= 0) ::close(fd_);
  }
  HeldPort(const HeldPort&) = delete;
  HeldPort& operator=(const HeldPort&) = delete;
  int port() const { return port_; }

 private:
  int port_, fd_;
};

// A shell script that runs `cmd` (a dtrain command) with TMPDIR=tmp in the background, sends it
// SIGTERM `settle_s` seconds after something appears in tmp (its temp folder: it is under way),
// and prints "rc <its exit code> seen <yes|no>" and "left: <entries still in tmp>". The command
// runs under `timeout 120`: one that ignored the signal ends with 124.
inline std::string sigterm_once_in_tmp(const std::string& cmd, const std::string& tmp,
                                       double settle_s) {
  return "TMPDIR=" + tmp + " timeout 120 " + cmd +
         " & pid=$!; seen=no; for i in $(seq 600); do [ -n \"$(ls " + tmp +
         ")\" ] && { seen=yes; break; }; sleep 0.05; done; sleep " + std::to_string(settle_s) +
         "; kill -TERM $pid; wait $pid; echo \"rc $? seen $seen\"; echo \"left: $(ls " + tmp +
         " | wc -l)\"";
}

inline bool contains(const std::string& text, const std::string& part) {
  return text.find(part) != std::string::npos;
}

inline std::string read_text(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), {});
}

// A helper process's environment: its own variables and the sanitizers' options (the
// suppressions and log path scripts/sanitize.sh sets), so that a sanitized helper reports, and
// suppresses, as its parent does (without them TSan's reports on uninstrumented gRPC slow a
// helper past the timing its test expects).
inline std::vector<std::string> with_sanitizer_options(std::vector<std::string> vars) {
  for (const char* k : {"ASAN_OPTIONS", "UBSAN_OPTIONS", "LSAN_OPTIONS", "TSAN_OPTIONS"})
    if (const char* v = std::getenv(k)) vars.push_back(std::string(k) + "=" + v);
  return vars;
}

}  // namespace dtrain::testing
