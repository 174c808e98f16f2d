// PipeConsoleSink (console_sink.h).
#include "util/console_sink.h"

#include <fcntl.h>
#include <poll.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstdlib>
#include <string>

#include <fmt/format.h>

namespace dtrain {

spdlog::color_mode console_color_mode() {
  const char* no_color = std::getenv("NO_COLOR");
  return no_color != nullptr && *no_color != '\0' ? spdlog::color_mode::never
                                                  : spdlog::color_mode::automatic;
}

PipeConsoleSink::~PipeConsoleSink() {
  ::close(fd_);
}

size_t PipeConsoleSink::write_within(const char* p, size_t n, int wait_ms) {
  using Clock = std::chrono::steady_clock;
  const auto deadline = Clock::now() + std::chrono::milliseconds(wait_ms);
  size_t done = 0;
  while (done < n) {
    const ssize_t w = ::write(fd_, p + done, n - done);
    if (w > 0) {
      done += static_cast<size_t>(w);
      continue;
    }
    if (w < 0 && errno == EINTR) continue;
    if (w < 0 && errno != EAGAIN) break;  // EPIPE: the reader is gone for good
    const auto left =
        std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now()).count();
    if (left <= 0) break;
    pollfd pfd{fd_, POLLOUT, 0};
    ::poll(&pfd, 1, static_cast<int>(left));
  }
  return done;
}

void PipeConsoleSink::sink_it_(const spdlog::details::log_msg& msg) {
  spdlog::memory_buf_t line;
  formatter_->format(msg, line);
  // While lines are being dropped, the pipe is tried without waiting: the reader has been away
  // for kConsoleWaitMs already, and each line's wait would slow the run as much as blocking.
  const int wait = dropped_ > 0 ? 0 : kConsoleWaitMs;
  if (dropped_ > 0 && !say_dropped(0)) {
    dropped_ += line.size();
    return;
  }
  const size_t written = write_within(line.data(), line.size(), wait);
  // (a line cut in the middle is ended, so the next one starts a line of its own)
  if (written > 0 && written < line.size()) (void)write_within("\n", 1, 0);
  dropped_ += line.size() - written;
}

bool PipeConsoleSink::say_dropped(int wait_ms) {
  const std::string note = fmt::format(
      "[dtrain] {} bytes of log did not fit the console, which took none for {} s or more\n",
      dropped_, kConsoleWaitMs / 1000);
  const size_t written = write_within(note.data(), note.size(), wait_ms);
  if (written == 0) return false;
  if (written < note.size()) (void)write_within("\n", 1, 0);
  dropped_ = 0;
  return true;
}

void PipeConsoleSink::flush_() {
  if (dropped_ > 0) (void)say_dropped(kConsoleWaitMs);
}

std::shared_ptr<PipeConsoleSink> pipe_console_sink() {
  struct stat st {};
  if (::fstat(STDERR_FILENO, &st) != 0 || !S_ISFIFO(st.st_mode)) return nullptr;
  const int fd = ::open("/proc/self/fd/2", O_WRONLY | O_NONBLOCK | O_CLOEXEC);
  if (fd < 0) return nullptr;
  return std::make_shared<PipeConsoleSink>(fd);
}

}  // namespace dtrain
