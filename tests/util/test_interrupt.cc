// InterruptGuard's rules, with real signals raised in this process: the first SIGTERM asks for a
// soft stop; the launcher's death signal is a preemption request however often it comes (the
// kernel sends it once per re-parenting); a person's signal after it still stops softly.
#include <doctest/doctest.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <csignal>
#include <functional>
#include <string>

#include "util/interrupt.h"

using namespace dtrain;

namespace {

// Runs `body` in a forked child, where a signal may end the process, and returns the child's wait
// status; a body that returns (the process was not ended) exits 3.
int child_status(const std::function<void()>& body) {
  const pid_t pid = fork();
  REQUIRE(pid >= 0);
  if (pid == 0) {
    body();
    _exit(3);  // not ended
  }
  int status = 0;
  REQUIRE(waitpid(pid, &status, 0) == pid);
  return status;
}

}  // namespace

TEST_CASE("interrupts: the first SIGTERM asks for a soft stop and is remembered") {
  StopRequest req;
  InterruptGuard g(req);
  CHECK(req.signal.load() == 0);
  REQUIRE(::raise(SIGTERM) == 0);
  CHECK(req.signal.load() == SIGTERM);
  CHECK_FALSE(req.launcher_gone.load());
}

TEST_CASE("interrupts: SIGHUP and SIGUSR1 ask for a soft stop whatever the preemption signal") {
  for (const int preempt : {SIGTERM, SIGUSR1}) {
    for (const int sig : {SIGHUP, SIGUSR1}) {
      CAPTURE(preempt);
      CAPTURE(sig);
      StopRequest req;
      InterruptGuard g(req, preempt);
      REQUIRE(::raise(sig) == 0);  // the default action would end this test here
      CHECK(req.signal.load() == sig);
    }
  }
  CHECK(std::string(interrupt_signal_name(SIGHUP)) == "SIGHUP");
}

TEST_CASE("interrupts: the launcher's death signal, sent again and again, never escalates") {
  for (const int preempt : {SIGTERM, SIGUSR1}) {
    CAPTURE(preempt);
    StopRequest req;
    InterruptGuard g(req, preempt);
    // Three deliveries, as a launcher with several threads causes: still alive, one request.
    for (int i = 0; i < 3; ++i) REQUIRE(::raise(launcher_gone_signal()) == 0);
    CHECK(req.signal.load() == preempt);
    CHECK(req.launcher_gone.load());
    // Someone then sends SIGINT: the first a person sent, so a soft stop too (no re-raise, or
    // this test would be killed here).
    REQUIRE(::raise(SIGINT) == 0);
    CHECK(req.signal.load() == preempt);
    CHECK(req.asked_after_launcher.load());
    // ... delivered twice at once (to the process, then its group): one request, not a second
    // that ends the process (it compared against the launcher's signal and died by SIGINT).
    REQUIRE(::raise(SIGINT) == 0);
    CHECK(req.signal.load() == preempt);
  }
}

TEST_CASE("interrupts: the launcher's death signal after a person's stop changes nothing") {
  StopRequest req;
  InterruptGuard g(req);
  REQUIRE(::raise(SIGINT) == 0);
  REQUIRE(::raise(launcher_gone_signal()) == 0);
  CHECK(req.signal.load() == SIGINT);
  CHECK_FALSE(req.launcher_gone.load());
}

TEST_CASE("interrupts: a guard's end asks the kernel for no parent-death signal") {
  {
    StopRequest req;
    InterruptGuard g(req);
    REQUIRE(::prctl(PR_SET_PDEATHSIG, launcher_gone_signal()) == 0);
  }
  int sig = -1;
  REQUIRE(::prctl(PR_GET_PDEATHSIG, &sig) == 0);
  CHECK(sig == 0);
  // Its handler is gone too: the disposition is what it was (the default) before the guard.
  struct sigaction now {};
  REQUIRE(::sigaction(launcher_gone_signal(), nullptr, &now) == 0);
  CHECK((now.sa_handler == SIG_DFL));
}

TEST_CASE("interrupts: a stop asked before a rank starts waiting ends it when the wait begins") {
  // The signal came while the rank was starting (only recorded: nothing waits yet); when it
  // reaches the rendezvous (begin_at_once) it ends at once, as a signal during the wait does:
  // the preemption signal with kExitPreempted, another by its default action. Before, the
  // rendezvous waited out its timeout and the rank exited 1. In a child: the process ends.
  struct Case {
    int preempt, sig;
    bool exited;  // else killed by sig
  };
  for (const Case c : {Case{SIGTERM, SIGTERM, true}, Case{SIGUSR1, SIGINT, false}}) {
    CAPTURE(c.sig);
    const int status = child_status([&] {
      StopRequest req;
      InterruptGuard g(req, c.preempt);
      ::raise(c.sig);
      begin_at_once(req);
    });
    if (c.exited) {
      REQUIRE(WIFEXITED(status));
      CHECK(WEXITSTATUS(status) == kExitPreempted);
    } else {
      REQUIRE(WIFSIGNALED(status));
      CHECK(WTERMSIG(status) == c.sig);
    }
  }
  // The launcher dying while the rank joins (at_once set): the rank ends at once with the
  // preemption's code, whichever the preemption signal is. Before, the death signal was only
  // recorded, and the rank waited out rendezvous_timeout_s for peers that were gone.
  for (const int preempt : {SIGTERM, SIGUSR1}) {
    CAPTURE(preempt);
    const int status = child_status([&] {
      StopRequest r;
      InterruptGuard g(r, preempt);
      begin_at_once(r);
      ::raise(launcher_gone_signal());
    });
    REQUIRE(WIFEXITED(status));
    CHECK(WEXITSTATUS(status) == kExitPreempted);
  }
  // No stop asked: it only sets at_once.
  StopRequest req;
  InterruptGuard g(req);
  begin_at_once(req);
  CHECK(req.at_once.load());
}

TEST_CASE("interrupts: any stop signal at once after the first is one request, later a second") {
  // timeout(1) signals its child and then the child's process group, so a rank receives the same
  // signal twice within a moment (3 of 8 runs under timeout ended at once, with no checkpoint);
  // a script that traps Ctrl-C sends its background ranks SIGTERM a moment after the terminal's
  // SIGINT reached them. Each pair is one request. Past the window, a signal is a second request
  // and ends the process at once. (The window is widened and narrowed here so that neither
  // check depends on this machine's speed.)
  for (const int second : {SIGINT, SIGTERM, SIGHUP, SIGUSR1}) {
    CAPTURE(second);
    {
      StopRequest req;
      req.same_request_ns = int64_t{60} * 1'000'000'000;
      InterruptGuard g(req);
      REQUIRE(::raise(SIGINT) == 0);
      REQUIRE(::raise(second) == 0);  // the default action would end this test here
      CHECK(req.signal.load() == SIGINT);
    }
    const int status = child_status([&] {
      StopRequest r;
      r.same_request_ns = 1;
      InterruptGuard g2(r);
      ::raise(SIGINT);
      ::usleep(1000);
      ::raise(second);
    });
    REQUIRE(WIFSIGNALED(status));
    CHECK(WTERMSIG(status) == second);
  }
}

TEST_CASE("interrupts: SIGINT ignored on entry is caught, nohup's SIGHUP stays ignored") {
  // A non-interactive shell starts `dtrain run ... &` with SIGINT ignored: a Ctrl-C at the
  // terminal ended the script and left its ranks training. In a child: dispositions change.
  const int status = child_status([&] {
    ::signal(SIGINT, SIG_IGN);
    ::signal(SIGHUP, SIG_IGN);
    {
      StopRequest r;
      InterruptGuard g(r);
      ::raise(SIGHUP);  // ignored
      if (r.signal.load() != 0) ::_exit(4);
      ::raise(SIGINT);
      if (r.signal.load() != SIGINT) ::_exit(5);
    }
    // The guard gives back what it found: ignored.
    struct sigaction now {};
    ::sigaction(SIGINT, nullptr, &now);
    ::_exit(now.sa_handler == SIG_IGN ? 0 : 6);
  });
  REQUIRE(WIFEXITED(status));
  CHECK(WEXITSTATUS(status) == 0);
}

TEST_CASE("interrupts: once the run's results are saved, a second signal exits with its code") {
  // srun --kill-on-bad-exit SIGTERMs the ranks still tearing down when the first of a preempted
  // job's ranks exits 75: that second SIGTERM must not turn the job's 75 (requeue) into 143.
  // Before the results are saved, a second signal still ends the process by its default action
  // (the previous test). In a child: the process ends.
  for (const int code : {kExitPreempted, 0, 130}) {
    CAPTURE(code);
    const int status = child_status([&] {
      StopRequest r;
      r.same_request_ns = 1;
      InterruptGuard g(r);
      ::raise(SIGTERM);  // the preemption notice: a soft stop
      r.done_code.store(code);
      ::usleep(1000);
      ::raise(SIGTERM);  // srun's, during teardown
    });
    REQUIRE(WIFEXITED(status));
    CHECK(WEXITSTATUS(status) == code);
  }
}

TEST_CASE("interrupts: after the guard of a run that saved its results, a signal keeps its code") {
  // A script's trap passes on the Ctrl-C that reached its ranks too; a rank that had stopped and
  // saved already was tearing down, its guard gone, and the late copy killed it by the signal.
  for (const int code : {130, 0}) {
    CAPTURE(code);
    const int status = child_status([&] {
      StopRequest r;
      {
        InterruptGuard g(r);
        ::raise(SIGINT);
        r.done_code.store(code);
      }
      ::raise(SIGINT);
    });
    REQUIRE(WIFEXITED(status));
    CHECK(WEXITSTATUS(status) == code);
  }
}

TEST_CASE(
    "interrupts: a stop signal while a failed rank tears down exits with the failure's code") {
  // srun --kill-on-bad-exit SIGTERMs the ranks still failing: that SIGTERM (the preemption
  // signal) must not turn a failure into 75, which requeues the job; nor the launcher's death.
  for (const int sig : {SIGTERM, SIGINT, launcher_gone_signal()}) {
    CAPTURE(sig);
    const int status = child_status([&] {
      StopRequest r;
      InterruptGuard g(r);
      r.failed_code.store(2);
      ::raise(sig);
    });
    REQUIRE(WIFEXITED(status));
    CHECK(WEXITSTATUS(status) == 2);
  }
}
