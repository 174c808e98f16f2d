#include "train/async_checkpoint.h"

#include <cstdio>
#include <cstdlib>

#include <spdlog/spdlog.h>

#include "util/check.h"
#include "util/duration.h"
#include "util/interrupt.h"

namespace dtrain {

BackgroundWriter::~BackgroundWriter() {
  if (thread_.joinable()) thread_.join();
}

void BackgroundWriter::start(std::function<void()> job) {
  DT_CHECK_MSG(!thread_.joinable(), "a checkpoint write is still in flight");
  {
    std::lock_guard<std::mutex> lk(mu_);
    finished_ = false;
    error_ = nullptr;
  }
  thread_ = std::thread([this, job = std::move(job)] {
    std::exception_ptr err;
    try {
      job();
    } catch (...) {
      err = std::current_exception();
    }
    std::lock_guard<std::mutex> lk(mu_);
    error_ = err;
    finished_ = true;
  });
}

bool BackgroundWriter::finished() const {
  std::lock_guard<std::mutex> lk(mu_);
  return thread_.joinable() && finished_;
}

void BackgroundWriter::wait() {
  if (!thread_.joinable()) return;
  thread_.join();
  std::exception_ptr err;
  {
    std::lock_guard<std::mutex> lk(mu_);
    err = error_;
    error_ = nullptr;
  }
  if (err) std::rethrow_exception(err);
}

void SaveDeadline::start(double seconds, std::function<std::string()> message) {
  DT_CHECK(seconds > 0);
  DT_CHECK_MSG(!thread_.joinable(), "the save deadline is already armed");
  const auto until = deadline_in(seconds);
  thread_ = std::thread([this, until, message = std::move(message)] {
    std::unique_lock<std::mutex> lk(mu_);
    if (cv_.wait_until(lk, until, [this] { return cancelled_; })) return;
    spdlog::error("{}", message());
    spdlog::default_logger()->flush();
    std::fflush(stdout);
    std::fflush(stderr);
    std::_Exit(kExitPreempted);
  });
}

void SaveDeadline::cancel() {
  if (!thread_.joinable()) return;
  {
    std::lock_guard<std::mutex> lk(mu_);
    cancelled_ = true;
  }
  cv_.notify_all();
  thread_.join();
}

}  // namespace dtrain
