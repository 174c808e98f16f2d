// One attempt of `dtrain launch` on this node (attempt.h).
#include "launch/attempt.h"

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cmath>
#include <ctime>
#include <deque>
#include <filesystem>
#include <fstream>
#include <map>
#include <optional>
#include <set>
#include <stdexcept>
#include <utility>
#include <vector>

#include <spdlog/spdlog.h>

#include "comm/shm_ring.h"
#include "launch/dist_env.h"
#include "launch/error_file.h"
#include "util/check.h"
#include "util/duration.h"
#include "util/fs.h"
#include "util/interrupt.h"

namespace dtrain::launch_detail {
namespace {

std::string now_text() {
  const std::time_t t = std::time(nullptr);
  std::tm tm{};
  ::localtime_r(&t, &tm);
  char buf[64];
  std::strftime(buf, sizeof buf, "%Y-%m-%d %H:%M:%S", &tm);
  return buf;
}

// Prints the last lines of a failed rank's log to stderr, so its error is seen without opening
// the file.
void print_log_tail(const std::string& path, int rank) {
  std::ifstream in(path);
  std::deque<std::string> tail;
  std::string line;
  while (std::getline(in, line)) {
    tail.push_back(line);
    if (tail.size() > 8) tail.pop_front();
  }
  if (tail.empty()) return;
  std::fprintf(stderr, "---- last lines of %s\n", path.c_str());
  for (const auto& l : tail) std::fprintf(stderr, "[rank %d] %s\n", rank, l.c_str());
  std::fflush(stderr);
}

int64_t wall_ms() {
  return std::chrono::duration_cast<std::chrono::milliseconds>(
             std::chrono::system_clock::now().time_since_epoch())
      .count();
}

// Opens (appending, so a relaunch keeps the earlier attempts) and heads this node's rank logs.
std::vector<Fd> open_rank_logs(const LaunchOptions& o, const AttemptPlan& plan, int attempt) {
  std::vector<Fd> logs;
  for (int l = 0; l < plan.nproc; ++l) {
    const int r = plan.first_rank + l;
    const std::string path = rank_log_path(o.log_dir, r);
    try {
      own_file_for_append(path);  // (a run folder copied with links: not into the other's log)
    } catch (const std::runtime_error& e) {
      throw UserError(e.what());
    }
    Fd fd(::open(path.c_str(), O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644));
    if (!fd.open()) throw UserError("cannot open '" + path + "': " + strerror(errno));
    const std::string sep = "==== dtrain launch " + now_text() + ": rank " + std::to_string(r) +
                            " of " + std::to_string(plan.world) +
                            (attempt > 0 ? ", restart " + std::to_string(attempt) + " of " +
                                               std::to_string(o.max_restarts)
                                         : std::string()) +
                            " ====\n";
    if (!write_fully(fd.get(), sep.data(), sep.size())) throw sys_error("write '" + path + "'");
    logs.push_back(std::move(fd));
  }
  return logs;
}

// The ranks' environment: ours plus the torchrun contract (resolve_dist_env reads it), less
// RANK and LOCAL_RANK (per rank). Logs where the ranks go.
std::map<std::string, std::string> rank_environment(const LaunchOptions& o, const AttemptPlan& plan,
                                                    int attempt, int port,
                                                    const std::string& token) {
  std::map<std::string, std::string> base = current_environment();
  base["WORLD_SIZE"] = std::to_string(plan.world);
  base["LOCAL_WORLD_SIZE"] = std::to_string(plan.nproc);
  base["MASTER_ADDR"] = plan.master_addr;
  base["MASTER_PORT"] = std::to_string(port);
  base["DTRAIN_JOB_TOKEN"] = token;
  base["DTRAIN_RESTART_COUNT"] = std::to_string(attempt);
  // The rest of torchrun's worker environment (one role, one group per node), for scripts and
  // libraries that read it.
  base["GROUP_RANK"] = std::to_string(plan.node_rank);
  base["GROUP_WORLD_SIZE"] = std::to_string(plan.nnodes);
  base["ROLE_NAME"] = "default";
  base["ROLE_WORLD_SIZE"] = std::to_string(plan.world);
  base["TORCHELASTIC_RESTART_COUNT"] = std::to_string(attempt);
  base["TORCHELASTIC_MAX_RESTARTS"] = std::to_string(o.max_restarts);
  base["TORCHELASTIC_RUN_ID"] = plan.run_id;
  // (a torchrun agent's, inherited: this launcher serves no store on MASTER_PORT, and the rule
  // it sets off in resolve_dist_env would move rank 0 onto the launchers' port)
  base.erase("TORCHELASTIC_USE_AGENT_STORE");
  base[kLauncherPidEnv] = std::to_string(::getpid());  // end_with_launcher
  if (plan.agent == nullptr)
    spdlog::info(
        "launching {} rank(s): master 127.0.0.1:{}, logs in {}/rank-<r>.log (rank 0 also "
        "shown here)",
        plan.nproc, port, o.log_dir);
  else
    spdlog::info(
        "node {} of {}: launching ranks {}..{} of {}: master {}:{}, logs in {}/rank-<r>.log "
        "(rank {} also shown here)",
        plan.node_rank, plan.nnodes, plan.first_rank, plan.first_rank + plan.nproc - 1, plan.world,
        plan.master_addr, port, o.log_dir, plan.first_rank);
  return base;
}

// One attempt (one start of this node's ranks), supervised until every rank has exited
// (launch_local's contract, for one attempt).
class Attempt {
 public:
  Attempt(const LaunchOptions& o, const AttemptPlan& plan, int attempt, SignalGuard& signals)
      : o_(o), plan_(plan), attempt_(attempt), signals_(signals) {
    if (plan.agent != nullptr) {
      next_poll_ = Clock::now() + kPollEvery;
      node_text_ = " on node " + std::to_string(o.node_rank) + " (" + plan.agent->host_name() + ")";
    }
  }

  // Opens the logs and starts every rank with `argv`.
  void start(const std::vector<std::string>& argv, int port, const std::string& token) {
    std::vector<Fd> logs = open_rank_logs(o_, plan_, attempt_);
    const std::map<std::string, std::string> base =
        rank_environment(o_, plan_, attempt_, port, token);
    std::fflush(stdout);  // the tee writes rank 0's bytes straight to the descriptors
    std::fflush(stderr);

    // Rank 0's two pipes, read here; the write ends are only in rank 0 (CLOEXEC elsewhere).
    log0_ = std::move(logs[0]);
    Fd tee_w[2];
    for (int i = 0; i < 2; ++i) {
      int p[2];
      if (::pipe2(p, O_CLOEXEC) != 0) throw sys_error("pipe2");
      tees_[i].src = Fd(p[0]);
      tee_w[i] = Fd(p[1]);
      if (::fcntl(p[0], F_SETFL, O_NONBLOCK) != 0) throw sys_error("fcntl");
      // Rank 0 blocks on a full pipe while this process does not read it (stopped: Ctrl-Z,
      // SIGSTOP, a debugger), and its peers then time out waiting for it: 1 MiB instead of the
      // default 64 KiB holds hours of a run's log lines rather than minutes. Best effort
      // (fs.pipe-max-size may be lower for an unprivileged user, whose pipes also count against
      // fs.pipe-user-pages-soft, 64 MiB: many concurrent launches make that user's new pipes
      // small, never fail them).
      (void)::fcntl(p[1], F_SETPIPE_SZ, 1 << 20);
      tees_[i].log_fd = log0_.get();
      tees_[i].console = i == 0 ? STDOUT_FILENO : STDERR_FILENO;
      tees_[i].console_ok = o_.echo_rank0;
      tees_[i].log_path = rank_log_path(o_.log_dir, plan_.first_rank);
    }
    std::vector<std::string> program = argv;
    program.at(0) = rank_program(argv.at(0));
    for (int l = 0; l < plan_.nproc; ++l) {
      const int r = plan_.first_rank + l;
      std::map<std::string, std::string> env = base;
      env["RANK"] = std::to_string(r);
      env["LOCAL_RANK"] = std::to_string(l);
      env["ROLE_RANK"] = std::to_string(r);
      env[kErrorFileEnv] = rank_error_path(o_.log_dir, r);
      ::unlink(env[kErrorFileEnv].c_str());  // (an earlier attempt's)
      std::vector<std::string> env_s;
      for (const auto& [k, v] : env) env_s.push_back(k + "=" + v);
      const int out_fd = l == 0 ? tee_w[0].get() : logs[static_cast<size_t>(l)].get();
      const int err_fd = l == 0 ? tee_w[1].get() : logs[static_cast<size_t>(l)].get();
      pid_t pid = -1;
      if (const int rc = spawn_rank(program, env_s, out_fd, err_fd, &pid, o_.inherit_fd); rc != 0)
        throw std::runtime_error("cannot start rank " + std::to_string(r) + " ('" + argv[0] +
                                 "'): " + strerror(rc));
      kids_.add(r, pid);
      if (l == 0) {
        tee_w[0].reset();  // so the tee sees EOF when rank 0 is gone
        tee_w[1].reset();
      } else {
        logs[static_cast<size_t>(l)].reset();
      }
    }
  }

  AttemptResult supervise() {
    while (kids_.any_running()) {
      wait_for_events();
      take_signals();
      for (Tee& t : tees_) t.pump(16);
      if (next_poll_ && Clock::now() >= *next_poll_) poll_agent();
      reap_exited();
      check_timers();
    }
    // Whatever rank 0 wrote before exiting is still in the pipes. A console that missed some
    // gets up to 60 s in all to take the word on it (a signal ends the wait).
    const auto until = Clock::now() + std::chrono::seconds(60);
    for (Tee& t : tees_) {
      t.pump(4096);
      t.note_dropped(until, signals_.fd());
    }
    follow_named_cause(res_, reaped_, plan_.first_rank, plan_.nproc, o_.log_dir);
    return res_;
  }

 private:
  // Multi-node: how often the other nodes' news is read (a failure there stops the ranks here
  // within this much of its report, well before the ranks' heartbeats would notice).
  static constexpr auto kPollEvery = std::chrono::milliseconds(500);

  static Clock::duration seconds(double s) { return seconds_duration(s); }

  void terminate_all(int sig, Clock::duration wait) {
    shutting_down_ = true;
    kids_.signal_running(sig);
    kill_at_ = Clock::now() + wait;
  }

  void kill_all() {
    if (kill_sent_) return;
    kill_sent_ = true;
    kids_.signal_running(SIGKILL);
    give_up_at_ = Clock::now() + kAfterKill;
  }

  // Until a signal, rank 0's output, or the next timer; SIGCHLD wakes it through the self-pipe.
  void wait_for_events() {
    int timeout_ms = 1000;  // a safety net only
    for (const auto& t : {kill_sent_ ? std::nullopt : kill_at_, give_up_at_,
                          shutting_down_ ? std::nullopt : term_at_, next_poll_}) {
      if (!t) continue;
      const auto left = std::chrono::ceil<std::chrono::milliseconds>(*t - Clock::now()).count();
      timeout_ms = static_cast<int>(std::clamp<int64_t>(left, 0, timeout_ms));
    }
    pollfd fds[3];
    nfds_t n = 0;
    fds[n++] = {signals_.fd(), POLLIN, 0};
    for (Tee& t : tees_)
      if (t.src.open()) fds[n++] = {t.src.get(), POLLIN, 0};
    if (::poll(fds, n, timeout_ms) < 0 && errno != EINTR) throw sys_error("poll");
  }

  // Ctrl-Z at a terminal stops the launcher's process group, not its ranks' (each has its own):
  // they trained on, rank 0 blocked once its console pipe filled, and its peers failed at their
  // collective timeout, blaming it. The ranks stop with the launcher and continue with it (fg,
  // bg, SIGCONT); their heartbeats judge peers afresh after such a pause. The launcher's own
  // timers (a grace period under way) move by the pause.
  void suspend() {
    kids_.signal_running(SIGSTOP);
    spdlog::warn(
        "received SIGTSTP: suspending the ranks and this launcher (fg or SIGCONT "
        "continues them){}",
        plan_.agent != nullptr ? "; the other nodes' ranks fail for want of them after heartbeat_s"
                               : "");
    const auto t0 = Clock::now();
    ::raise(SIGSTOP);
    const auto paused = Clock::now() - t0;
    for (std::optional<Clock::time_point>* t : {&term_at_, &kill_at_, &give_up_at_})
      if (*t) **t += paused;
    kids_.signal_running(SIGCONT);
    spdlog::info("continued: the ranks continue");
  }

  void take_signals() {
    for (int sig : signals_.take()) {
      if (sig == SIGCHLD || sig == SIGPIPE) continue;
      if (sig == SIGTSTP) {
        suspend();
        continue;
      }
      if (!shutting_down_) {
        // (forwarded before it is logged: a console nobody reads blocks the log line)
        res_.stop_signal = sig;
        forwarded_at_ = Clock::now();
        terminate_all(sig, seconds(o_.interrupt_grace_s));
        spdlog::warn("received {}: forwarding it to the ranks", signal_name(sig));
        if (plan_.agent != nullptr) plan_.agent->report_stop(attempt_, sig);
      } else if (res_.stop_signal != 0 && Clock::now() - forwarded_at_ < kSameRequest) {
        // A stop signal at once after the first is the same request delivered twice (timeout(1)
        // signals its child and then its process group; a script's trap passes on the Ctrl-C
        // the terminal sent), not a person asking again (util/interrupt.h kSameRequestNs).
        spdlog::debug("received {} at once after {}: taken as the same request", signal_name(sig),
                      signal_name(res_.stop_signal));
      } else if (!kill_sent_) {
        if (res_.stop_signal == 0) res_.late_signal = sig;  // (stopping for a failure)
        kill_all();
        spdlog::warn("received {} while stopping: killing the ranks now", signal_name(sig));
      } else if (res_.stop_signal == 0) {
        res_.late_signal = sig;
      }
    }
  }

  // Reads the other nodes' news: a failure there stops the ranks here (SIGTERM), a signal
  // there is forwarded here as the same signal.
  void poll_agent() {
    const RemoteNews news = plan_.agent->poll(attempt_);
    next_poll_ = Clock::now() + kPollEvery;
    std::vector<std::string> failures = news.failures;
    if (!news.lost.empty()) {
      next_poll_.reset();  // once is enough
      failures.push_back("lost node 0's launcher: " + news.lost);
    }
    for (const std::string& f : failures) {
      spdlog::error("{}", f);
      if (res_.remote_failure.empty()) res_.remote_failure = f;
    }
    if (!failures.empty() && !shutting_down_ && !term_at_) term_at_ = Clock::now();
    if (news.stop_signal != 0 && !shutting_down_) {
      spdlog::warn("another node's launcher received {}: forwarding it to the ranks",
                   signal_name(news.stop_signal));
      res_.stop_signal = news.stop_signal;
      terminate_all(news.stop_signal, seconds(o_.interrupt_grace_s));
    }
  }

  // Collects every rank that has exited and judges how. Ranks found dead in one sweep are
  // judged those killed by a signal first: a rank killed from outside (an OOM kill, a fault)
  // is what its peers noticed and exited for, and under load the launcher may see both at once
  // -- rank order would then blame the peer that noticed.
  void reap_exited() {
    std::vector<Child*> killed, exited;
    for (Child& c : kids_.all()) {
      if (!c.running) continue;
      siginfo_t info{};
      // WNOWAIT: the exited rank stays a zombie, so its pid (= its group id) cannot be reused
      // while what is left of its group is killed.
      if (::waitid(P_PID, static_cast<id_t>(c.pid), &info, WEXITED | WNOHANG | WNOWAIT) != 0 ||
          info.si_pid == 0)
        continue;
      (info.si_code == CLD_EXITED ? exited : killed).push_back(&c);
    }
    for (Child* c : killed) reap(*c);
    for (Child* c : exited) reap(*c);
  }

  // Collects rank c, which has exited (reap_exited saw it), and judges how.
  void reap(Child& c) {
    ::kill(-c.pid, SIGKILL);
    // A rank that died before its local peers attached to its shared memory leaves the segment
    // named after its pid (nobody unlinks it). It is still a zombie, so the pid is its own.
    for (const std::string& seg : remove_segments_of(c.pid))
      spdlog::info("rank {}: removed the shared memory it left ({})", c.rank, seg);
    int status = 0;
    while (::waitpid(c.pid, &status, 0) < 0 && errno == EINTR) {
    }
    c.running = false;
    reaped_.status[c.rank] = status;
    if (shutting_down_) reaped_.stopped_here.insert(c.rank);
    int code = WIFEXITED(status) ? WEXITSTATUS(status) : -2;
    // Killed by the signal forwarded from here, before its handler was installed (a rank still
    // starting): stopped as that handler would have made it (it had nothing to save), not killed.
    const int fwd = res_.stop_signal != 0 ? res_.stop_signal : rank_stop_signal_;
    if (fwd != 0 && !kill_sent_ && WIFSIGNALED(status) && WTERMSIG(status) == fwd)
      code = fwd == o_.preempt_signal ? kExitPreempted : 128 + fwd;
    // Killed by a stop signal that did not come from here: a second SIGTERM or SIGINT sent to
    // the rank itself, which ends it at once (util/interrupt.h): stopped by whoever sent it,
    // with a shell's code for it, not a failure to restart (the job was restarted).
    else if (!shutting_down_ && !kill_sent_ && WIFSIGNALED(status) &&
             is_stop_code(128 + WTERMSIG(status)))
      code = 128 + WTERMSIG(status);
    res_.common_exit = res_.common_exit == -1 || res_.common_exit == code ? code : -2;
    if (code == 2) res_.any_user_error = true;
    // A rank that exits with an interrupt's code although no signal came here was stopped by
    // its peers' agreement, for a signal another node's launcher received (and reported before
    // forwarding it): read that news now, so this is a stop, not a failure.
    if (!shutting_down_ && next_poll_ && is_stop_code(code)) poll_agent();
    if (shutting_down_) {
      spdlog::info("rank {} stopped: {}", c.rank, describe_wait_status(status));
    } else if (code == 0) {
      spdlog::info("rank {} finished", c.rank);
    } else if (is_stop_code(code) && !res_.failed && plan_.agent == nullptr) {
      on_rank_stop(c.rank, code, status);
    } else {
      on_failure(c.rank, status);
    }
  }

  // A rank exited with a stop code though no signal came here: someone signalled that rank
  // (kill, a scheduler that signals ranks rather than the launcher). It checkpointed a step its
  // peers agreed on, so they follow with the same code: a stop to pass through, not a failure to
  // restart. Ranks still running after interrupt_grace_s are stopped as for a failure.
  // One node only: across nodes, ranks also stop so (75) when another node's launcher is lost
  // (its ranks take their launcher's death as a preemption), and node 0 restarts without it.
  void on_rank_stop(int rank, int code, int status) {
    // Which rank the signal reached is not known here: every rank exits with the same code
    // once they agree on the stop, and the first one reaped need not be it.
    if (res_.rank_stop_code == 0) {
      if (WIFSIGNALED(status))
        spdlog::warn(
            "rank {} stopped: {}, sent to it and not to the launcher (a second stop signal ends a "
            "rank at once): the ranks stop, without a restart",
            rank, describe_wait_status(status));
      else
        spdlog::warn(
            "rank {} stopped: exit status {}{}; no signal came to the launcher: a rank of this "
            "job was signalled and the ranks stop at the step they agreed on",
            rank, code, code == kExitPreempted ? ", preempted" : "");
      res_.rank_stop_rank = rank;
      res_.rank_stop_code = code;
      // The same signal to the others: a rank signalled before the rendezvous ended at once,
      // and its peers, which cannot hear its vote, would wait out rendezvous_timeout_s for it;
      // ranks past it take the signal as the stop they are agreeing on already.
      rank_stop_signal_ = code == kExitPreempted ? o_.preempt_signal : code - 128;
      kids_.signal_running(rank_stop_signal_);
    } else {
      spdlog::info("rank {} stopped: exit status {}", rank, code);
    }
    if (!term_at_) term_at_ = Clock::now() + seconds(o_.interrupt_grace_s);
  }

  void on_failure(int rank, int status) {
    spdlog::error("rank {}{}", rank, failed_text(status, node_text_, false));
    // A rank that refused its input (exit 2) is the cause even when a peer that relayed its
    // abort ("rank 0 aborted: ...", exit 1) was reaped first.
    const auto bad_input = [](int st) { return WIFEXITED(st) && WEXITSTATUS(st) == 2; };
    if (res_.failed && bad_input(status) && !bad_input(res_.first_failed_status)) {
      res_.first_failed_rank = rank;
      res_.first_failed_status = status;
    }
    if (!res_.failed) {
      res_.first_failed_rank = rank;
      res_.first_failed_status = status;
      res_.first_failed_ms = wall_ms();
      if (plan_.agent != nullptr)
        plan_.agent->report_failure(attempt_, "rank " + std::to_string(rank) + node_text_ +
                                                  failed_text(status, node_text_, false));
    }
    res_.failed = true;
    res_.failed_ranks.push_back(rank);
    if (WIFSIGNALED(status)) res_.killed_ranks.push_back(rank);
    // Rank 0's output is already on the console; show the end of any other rank's log.
    if (rank != plan_.first_rank) print_log_tail(rank_log_path(o_.log_dir, rank), rank);
    // Ranks that fail for their own reason usually do so within moments of each other (bad
    // data on every rank, or a peer noticing the first one's exit): give them a short settling
    // window to exit and be reported with their real status before stopping the rest.
    if (!term_at_) term_at_ = Clock::now() + std::chrono::milliseconds(1000);
  }

  void check_timers() {
    if (term_at_ && !shutting_down_ && kids_.any_running() && Clock::now() >= *term_at_) {
      // A rank held stopped is what its failed peers waited for: name it, not the first rank
      // that gave up on it.
      if (res_.failed && res_.stopped_ranks.empty()) {
        res_.stopped_ranks = kids_.stopped_ranks();
        for (const int r : res_.stopped_ranks)
          spdlog::error(
              "rank {} is stopped (process state T: SIGSTOP, a debugger or a suspended job), not "
              "running: the ranks that failed were waiting for it",
              r);
      }
      if (res_.rank_stop_code != 0) {
        // They are stopping on a signal already: another from here is the same request to them
        // (util/interrupt.h), so the next step is SIGKILL.
        spdlog::warn("rank(s) {} still running {} s after a rank stopped: sending SIGKILL",
                     kids_.running_ranks(), o_.interrupt_grace_s);
        shutting_down_ = true;
        kill_all();
      } else {
        spdlog::warn("stopping rank(s) {}: SIGTERM, then SIGKILL after {} s", kids_.running_ranks(),
                     o_.grace_s);
        terminate_all(SIGTERM, seconds(o_.grace_s));
      }
    }
    const auto now = Clock::now();
    if (kids_.any_running() && kill_at_ && !kill_sent_ && now >= *kill_at_) {
      spdlog::warn("rank(s) {} still running {} s after {}: sending SIGKILL", kids_.running_ranks(),
                   res_.stop_signal != 0 ? o_.interrupt_grace_s : o_.grace_s,
                   signal_name(res_.stop_signal != 0 ? res_.stop_signal : SIGTERM));
      kill_all();
    }
    if (kids_.any_running() && give_up_at_ && now >= *give_up_at_) {
      spdlog::error("rank(s) {} did not exit after SIGKILL; leaving them behind",
                    kids_.running_ranks());
      kids_.abandon();
      res_.abandoned = true;
    }
  }

  const LaunchOptions& o_;
  const AttemptPlan& plan_;
  const int attempt_;
  SignalGuard& signals_;
  std::string node_text_;  // " on node R (host)" with several nodes
  Fd log0_;                // the first rank's log, written by the tees
  Tee tees_[2];
  // Declared after the pipes so that on an exception the ranks are killed and reaped first.
  ChildSet kids_;
  AttemptResult res_;
  ReapedRanks reaped_;
  bool shutting_down_ = false, kill_sent_ = false;
  int rank_stop_signal_ = 0;  // forwarded to the others after a rank stopped on its own
  // When the stop signal was forwarded; a stop signal within kSameRequest is the same request.
  Clock::time_point forwarded_at_{};
  static constexpr auto kSameRequest = std::chrono::nanoseconds(kSameRequestNs);
  std::optional<Clock::time_point> term_at_;  // when the ranks still running get SIGTERM
  std::optional<Clock::time_point> kill_at_, give_up_at_, next_poll_;
};

}  // namespace

AttemptResult run_attempt(const LaunchOptions& o, const AttemptPlan& plan,
                          const std::vector<std::string>& argv, int attempt, int port,
                          const std::string& token, SignalGuard& signals) {
  Attempt a(o, plan, attempt, signals);
  a.start(argv, port, token);
  return a.supervise();
}

}  // namespace dtrain::launch_detail
