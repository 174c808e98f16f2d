#include "util/interrupt.h"

#include <unistd.h>

#include <cstring>

#include "util/check.h"

namespace dtrain {

namespace {

// The request the handler writes to: a process-wide slot because signal handlers take no
// context. Only InterruptGuard sets it, one at a time.
std::atomic<StopRequest*> g_request{nullptr};

void on_interrupt(int sig) {
  StopRequest* req = g_request.load();
  if (req == nullptr) return;
  int expected = 0;
  if (req->signal.compare_exchange_strong(expected, sig)) return;  // first signal: stop softly
  // A second signal: stop at once, with the status the signal's default action gives.
  struct sigaction dfl {};
  dfl.sa_handler = SIG_DFL;
  sigemptyset(&dfl.sa_mask);
  ::sigaction(sig, &dfl, nullptr);
  ::raise(sig);
}

bool install(int sig, struct sigaction* old) {
  DT_CHECK_EQ(::sigaction(sig, nullptr, old), 0);
  if (old->sa_handler == SIG_IGN) return false;  // nohup and friends: stay ignored
  struct sigaction sa {};
  sa.sa_handler = on_interrupt;
  sigemptyset(&sa.sa_mask);
  sa.sa_flags = SA_RESTART;  // reads, writes and waits go on; the loop polls the request
  DT_CHECK_EQ(::sigaction(sig, &sa, nullptr), 0);
  return true;
}

}  // namespace

InterruptGuard::InterruptGuard(StopRequest& req, int preempt_signal) {
  DT_CHECK_MSG(preempt_signal == SIGTERM || preempt_signal == SIGUSR1,
               "the preemption signal is SIGTERM or SIGUSR1");
  StopRequest* expected = nullptr;
  DT_CHECK_MSG(g_request.compare_exchange_strong(expected, &req),
               "only one InterruptGuard may be alive at a time");
  int_installed_ = install(SIGINT, &old_int_);
  term_installed_ = install(SIGTERM, &old_term_);
  if (preempt_signal == SIGUSR1) usr1_installed_ = install(SIGUSR1, &old_usr1_);
}

InterruptGuard::~InterruptGuard() {
  if (int_installed_) ::sigaction(SIGINT, &old_int_, nullptr);
  if (term_installed_) ::sigaction(SIGTERM, &old_term_, nullptr);
  if (usr1_installed_) ::sigaction(SIGUSR1, &old_usr1_, nullptr);
  g_request.store(nullptr);
}

const char* interrupt_signal_name(int sig) {
  switch (sig) {
    case SIGINT:
      return "SIGINT";
    case SIGTERM:
      return "SIGTERM";
    case SIGUSR1:
      return "SIGUSR1";
    default:
      return "a signal";
  }
}

}  // namespace dtrain
