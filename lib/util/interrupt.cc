#include "util/interrupt.h"

#include <sys/prctl.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <ctime>

#include "util/check.h"
#include "util/fs.h"

namespace dtrain {

namespace {

// The request the handler writes to: a process-wide slot because signal handlers take no
// context. Only InterruptGuard sets it, one at a time.
std::atomic<StopRequest*> g_request{nullptr};
// The signal launcher_gone_signal() stands for; set with g_request.
std::atomic<int> g_preempt_signal{SIGTERM};
// set_signal_forwarder's process, or 0.
std::atomic<pid_t> g_forwarder{0};
// set_abrupt_exit_cleanup's function, or null.
std::atomic<void (*)()> g_abrupt_cleanup{nullptr};
// The code a stop signal ends the process with after an InterruptGuard whose run had saved its
// results (StopRequest::done_code) is gone.
std::atomic<int> g_code_after_guard{0};

// remove_if_empty_at_abrupt_exit's folder ("" for none), NUL-terminated.
char g_empty_dir[4096];

void abrupt_cleanup() {
  remove_temp_files_in_flight();
  if (void (*fn)() = g_abrupt_cleanup.load()) fn();
  if (g_empty_dir[0] != '\0') ::rmdir(g_empty_dir);  // (fails, harmlessly, unless empty)
}

// Ends the process by sig's default action (its status says which signal). Async-signal-safe.
// As PID 1 (a container's entry point) the kernel drops a signal whose action is the default,
// even one it raises itself: the status 128 + sig is then the exit code, as a shell reports it.
void die_by(int sig) {
  struct sigaction dfl {};
  dfl.sa_handler = SIG_DFL;
  sigemptyset(&dfl.sa_mask);
  ::sigaction(sig, &dfl, nullptr);
  ::raise(sig);
  if (::getpid() == 1) ::_exit(128 + sig);
}

// Ends a rank that is joining its job (nothing to save) on stop signal `sig`: 75 for the
// preemption signal; under a launcher 128 + sig as an exit code, which the launcher counts as a
// stop (a process killed by the signal read as a failure, to restart); else by the signal (in
// a handler, die_by returns and the signal, blocked while it runs, ends the process after it).
void end_joining(int sig) {
  if (sig == g_preempt_signal.load()) ::_exit(kExitPreempted);
  if (g_forwarder.load() > 0) ::_exit(128 + sig);
  die_by(sig);
}

// CLOCK_MONOTONIC in ns (clock_gettime is async-signal-safe).
int64_t monotonic_ns() {
  timespec ts{};
  ::clock_gettime(CLOCK_MONOTONIC, &ts);
  return static_cast<int64_t>(ts.tv_sec) * 1'000'000'000 + ts.tv_nsec;
}

// "dtrain: <signal><what>" on stderr, one line (async-signal-safe: write of string literals).
void say_signal(int sig, const char* what) {
  for (const char* text : {"dtrain: ", interrupt_signal_name(sig), what}) {
    const ssize_t w = ::write(STDERR_FILENO, text, std::strlen(text));
    (void)w;
  }
}

// A stop that ends a rank before its run began.
void say_ending_before_start(int sig) {
  say_signal(sig, " before the run began (nothing to save yet): exiting now\n");
}

// A stop signal while the rank tears down after its failure: it ends now, with the failure's code.
[[noreturn]] void end_failed(int sig, int code) {
  say_signal(sig, " while the failed rank tears down: exiting with its failure's code\n");
  abrupt_cleanup();
  ::_exit(code);
}

// Restores errno when a handler returns: the interrupted code may be between a failing call and
// its read of errno, and the handler's write() calls can change it.
class ErrnoGuard {
 public:
  ErrnoGuard() : saved_(errno) {}
  ~ErrnoGuard() { errno = saved_; }
  ErrnoGuard(const ErrnoGuard&) = delete;
  ErrnoGuard& operator=(const ErrnoGuard&) = delete;

 private:
  int saved_;
};

void on_interrupt(int sig, siginfo_t* info, void* /*context*/) {
  const ErrnoGuard keep_errno;
  StopRequest* req = g_request.load();
  if (req == nullptr) return;
  if (const int failed = req->failed_code.load(); failed >= 0) end_failed(sig, failed);
  if (req->at_once.load()) {
    say_ending_before_start(sig);
    abrupt_cleanup();
    end_joining(sig);
    return;
  }
  const int64_t now = monotonic_ns();
  int expected = 0;
  if (req->signal.compare_exchange_strong(expected, sig)) {  // first signal: stop softly
    req->first_ns.store(now);
    return;
  }
  // Any stop signal at once after the first: the same request, delivered twice (to the process,
  // then its group) or by two senders (the terminal's SIGINT, a script's SIGTERM). first_ns 0:
  // the first delivery's handler, on another thread, has not stored its time yet -- so this one
  // came at once too. (After the launcher's death first_ns is 1 until a person asks: never.)
  const int64_t first = req->first_ns.load();
  if (first == 0 || now - first < req->same_request_ns) return;
  // A copy the launcher forwarded (it never asks twice: it sends SIGKILL instead).
  const pid_t forwarder = g_forwarder.load();
  if (info != nullptr && info->si_code == SI_USER && forwarder > 0 && info->si_pid == forwarder)
    return;
  // The stop so far is the launcher's death: a person's first signal still stops softly.
  if (req->launcher_gone.load() && !req->asked_after_launcher.exchange(true)) {
    req->first_ns.store(now);
    return;
  }
  // A second signal: stop at once, with the status the signal's default action gives -- or, once
  // the run's results are saved, with the code the run ends with.
  abrupt_cleanup();
  if (const int done = req->done_code.load(); done >= 0) ::_exit(done);
  die_by(sig);
}

// After the guard of a run whose results are saved: what is left is teardown, and a stop
// signal (a copy of the first, late: a script's trap passing on the Ctrl-C that reached the rank
// too) ends it with the run's code, not by the signal's default action.
void on_signal_after_results(int) {
  abrupt_cleanup();
  ::_exit(g_code_after_guard.load());
}

// The launcher is gone, once or again: a stop by the preemption signal, never escalated.
void on_launcher_gone(int sig, siginfo_t*, void*) {
  const ErrnoGuard keep_errno;
  StopRequest* req = g_request.load();
  if (req == nullptr) return;
  if (const int failed = req->failed_code.load(); failed >= 0) end_failed(sig, failed);
  // Joining its job (nothing to save yet): end now, as the preemption signal would, rather than
  // wait out the rendezvous timeout for peers that went with the launcher.
  if (req->at_once.load()) {
    static constexpr char kLine[] =
        "dtrain: the launcher is gone while this rank was joining its job: exiting 75\n";
    const ssize_t w = ::write(STDERR_FILENO, kLine, sizeof(kLine) - 1);  // async-signal-safe
    (void)w;
    abrupt_cleanup();
    ::_exit(kExitPreempted);
  }
  int expected = 0;
  if (req->signal.compare_exchange_strong(expected, g_preempt_signal.load())) {
    req->launcher_gone.store(true);
    req->first_ns.store(1);  // no person's signal: one that follows is never "the same"
  }
}

// Handlers take the sender (SA_SIGINFO: on_interrupt tells set_signal_forwarder's copies).
// A signal ignored on entry stays ignored (nohup's SIGHUP), but for SIGINT: a non-interactive
// shell starts background jobs with it ignored, not a person (InterruptGuard's contract).
bool install(int sig, struct sigaction* old,
             void (*handler)(int, siginfo_t*, void*) = on_interrupt) {
  DT_CHECK_EQ(::sigaction(sig, nullptr, old), 0);
  if (old->sa_handler == SIG_IGN && sig != SIGINT) return false;
  struct sigaction sa {};
  sa.sa_sigaction = handler;
  sigemptyset(&sa.sa_mask);
  // reads, writes and waits go on; the loop polls the request
  sa.sa_flags = SA_RESTART | SA_SIGINFO;
  DT_CHECK_EQ(::sigaction(sig, &sa, nullptr), 0);
  return true;
}

}  // namespace

void end_by_stop_signals_removing_temp_files() {
  for (const int sig : {SIGINT, SIGTERM, SIGHUP}) {
    struct sigaction old {};
    install(sig, &old, [](int s, siginfo_t*, void*) {
      remove_temp_files_in_flight();
      die_by(s);
    });
  }
}

void set_signal_forwarder(pid_t pid) {
  g_forwarder.store(pid);
}

void begin_at_once(const StopRequest& req) {
  req.at_once.store(true);
  // A signal from now on finds at_once set (the handler ends the process); one before it was
  // recorded in req.signal and is acted on here.
  const int sig = req.signal.load();
  if (sig == 0) return;
  say_ending_before_start(sig);
  abrupt_cleanup();
  end_joining(sig);
}

void set_abrupt_exit_cleanup(void (*fn)()) {
  g_abrupt_cleanup.store(fn);
}

void run_abrupt_exit_cleanup() {
  abrupt_cleanup();
}

void remove_if_empty_at_abrupt_exit(const std::string& dir) {
  // (a path too long to keep is not removed: an empty folder left, as before)
  const size_t n = dir.size() < sizeof(g_empty_dir) ? dir.size() : 0;
  std::memcpy(g_empty_dir, dir.data(), n);
  g_empty_dir[n] = '\0';
}

InterruptGuard::InterruptGuard(StopRequest& req, int preempt_signal) {
  DT_CHECK_MSG(preempt_signal == SIGTERM || preempt_signal == SIGUSR1,
               "the preemption signal is SIGTERM or SIGUSR1");
  StopRequest* expected = nullptr;
  DT_CHECK_MSG(g_request.compare_exchange_strong(expected, &req),
               "only one InterruptGuard may be alive at a time");
  g_preempt_signal.store(preempt_signal);
  int_installed_ = install(SIGINT, &old_int_);
  term_installed_ = install(SIGTERM, &old_term_);
  // SIGHUP (the terminal or ssh session went away) and SIGUSR1 (when it is not the preemption
  // signal) are stops too: `dtrain launch` forwards both, and their default action would kill
  // the rank without its checkpoint.
  hup_installed_ = install(SIGHUP, &old_hup_);
  usr1_installed_ = install(SIGUSR1, &old_usr1_);
  gone_installed_ = install(launcher_gone_signal(), &old_gone_, on_launcher_gone);
}

InterruptGuard::~InterruptGuard() {
  const int done = g_request.load()->done_code.load();
  struct sigaction after {};
  after.sa_handler = on_signal_after_results;
  sigemptyset(&after.sa_mask);
  g_code_after_guard.store(done);
  // The run's results are saved (done >= 0): its stop signals keep ending the process with the
  // run's code; else the dispositions are given back.
  const auto restore = [&](int sig, const struct sigaction& old) {
    ::sigaction(sig, done >= 0 ? &after : &old, nullptr);
  };
  if (int_installed_) restore(SIGINT, old_int_);
  if (term_installed_) restore(SIGTERM, old_term_);
  if (hup_installed_) restore(SIGHUP, old_hup_);
  if (usr1_installed_) restore(SIGUSR1, old_usr1_);
  if (gone_installed_) {
    // A launcher that dies from now on must not end the process by the signal's default action
    // while it finishes: the kernel is told to send nothing (a no-op where nothing was asked).
    ::prctl(PR_SET_PDEATHSIG, 0);
    ::sigaction(launcher_gone_signal(), &old_gone_, nullptr);
  }
  g_request.store(nullptr);
}

int launcher_gone_signal() {
  return SIGRTMIN + 4;
}

const char* interrupt_signal_name(int sig) {
  switch (sig) {
    case SIGINT:
      return "SIGINT";
    case SIGTERM:
      return "SIGTERM";
    case SIGHUP:
      return "SIGHUP";
    case SIGUSR1:
      return "SIGUSR1";
    default:
      return "a signal";
  }
}

}  // namespace dtrain
