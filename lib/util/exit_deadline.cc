#include "util/exit_deadline.h"

#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <csignal>
#include <cstring>
#include <mutex>

#include "util/interrupt.h"

namespace dtrain {

namespace {

// What the handler says and exits with: set by the first of the deadlines alive at once (ranks
// that are threads of one process fail together), before alarm(2) arms it, and read only by the
// handler, which only an armed alarm runs. Guarded by g_mu; g_armed counts the live deadlines.
std::mutex g_mu;
int g_armed = 0;
char g_message[4096];
std::atomic<int> g_code{1};

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
  std::lock_guard<std::mutex> lk(g_mu);
  if (g_armed++ > 0) return;  // the first one's bound and error stand for all
  const size_t n = std::min(message.size(), sizeof(g_message) - 1);
  std::memcpy(g_message, message.data(), n);
  g_message[n] = '\0';
  g_code.store(exit_code);
  struct sigaction sa {};
  sa.sa_handler = on_deadline;
  sigemptyset(&sa.sa_mask);
  ::sigaction(SIGALRM, &sa, nullptr);
  ::alarm(seconds);
}

ExitDeadline::~ExitDeadline() {
  std::lock_guard<std::mutex> lk(g_mu);
  if (--g_armed == 0) ::alarm(0);
}

}  // namespace dtrain
