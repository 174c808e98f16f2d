#include "util/exit_deadline.h"

#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <csignal>
#include <cstring>

#include "util/interrupt.h"

namespace dtrain {

namespace {

// What the handler says and exits with (set before alarm(2) arms it; read in the handler).
char g_message[4096];
std::atomic<int> g_code{1};
std::atomic<unsigned> g_seconds{0};

void put(const char* text, size_t n) {
  const ssize_t w = ::write(STDERR_FILENO, text, n);
  (void)w;
}

void on_deadline(int) {
  put("error: ", 7);
  put(g_message, std::strlen(g_message));
  static constexpr char kWhy[] =
      "\ndtrain: the failed rank's teardown (its gRPC connections) did not end in time: "
      "exiting now\n";
  put(kWhy, sizeof(kWhy) - 1);
  run_abrupt_exit_cleanup();
  ::_exit(g_code.load());
}

}  // namespace

ExitDeadline::ExitDeadline(unsigned seconds, int exit_code, std::string_view message) {
  const size_t n = std::min(message.size(), sizeof(g_message) - 1);
  std::memcpy(g_message, message.data(), n);
  g_message[n] = '\0';
  g_code.store(exit_code);
  g_seconds.store(seconds);
  struct sigaction sa {};
  sa.sa_handler = on_deadline;
  sigemptyset(&sa.sa_mask);
  ::sigaction(SIGALRM, &sa, nullptr);
  ::alarm(seconds);
}

ExitDeadline::~ExitDeadline() {
  ::alarm(0);
}

}  // namespace dtrain
