#include "util/stop_notice.h"

#include <chrono>

#include <spdlog/spdlog.h>

namespace dtrain {

void note_stop_received(const StopRequest& req, bool shows_run) {
  const int sig = req.signal.load();
  if (sig == 0 || req.launcher_gone.load()) return;
  std::call_once(req.noticed, [sig, shows_run] {
    spdlog::log(shows_run ? spdlog::level::warn : spdlog::level::info,
                "received {}: the run stops at the next step every rank agrees on, once what it "
                "is doing now ends, and writes a checkpoint (a second one ends it at once)",
                interrupt_signal_name(sig));
  });
}

StopNotice::StopNotice(const StopRequest& req, bool shows_run)
    : t_([this, &req, shows_run] { watch(req, shows_run); }) {}

StopNotice::~StopNotice() {
  {
    std::lock_guard<std::mutex> lk(mu_);
    done_ = true;
  }
  cv_.notify_all();
  t_.join();
}

void StopNotice::watch(const StopRequest& req, bool shows_run) {
  std::unique_lock<std::mutex> lk(mu_);
  while (!cv_.wait_for(lk, std::chrono::milliseconds(100), [&] { return done_; })) {
    if (req.signal.load() == 0) continue;
    note_stop_received(req, shows_run);
    cv_.wait(lk, [&] { return done_; });
    return;
  }
}

}  // namespace dtrain
