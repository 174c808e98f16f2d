// The log's sink when standard error is a pipe (`dtrain run ... 2>&1 | tee run.log`, `| less`):
// a reader that stops reading (a pager not scrolled, a terminal's Ctrl-S, a stalled log shipper)
// fills the pipe, and a blocking write then held the rank that logged -- in-process ranks share
// the process's log -- until its peers' collectives timed out (distributed.timeout_s) and the
// run failed. Here a line waits for the pipe at most kConsoleWaitMs; after that, lines that do not
// fit are dropped (counted) until the reader takes them again, and the next line that fits is
// preceded by one saying how many bytes were lost, as `dtrain launch` does for its ranks' output.
#pragma once

#include <cstddef>
#include <memory>
#include <mutex>

#include <spdlog/common.h>
#include <spdlog/sinks/base_sink.h>

namespace dtrain {

inline constexpr int kConsoleWaitMs = 2000;

// The log's colours on a terminal: none when NO_COLOR is set and not empty (no-color.org), else
// spdlog's automatic choice (a terminal whose TERM it knows for colours).
spdlog::color_mode console_color_mode();

// Thread-safe (base_sink's mutex). Owns `fd`: a non-blocking descriptor of the pipe.
class PipeConsoleSink final : public spdlog::sinks::base_sink<std::mutex> {
 public:
  explicit PipeConsoleSink(int fd) : fd_(fd) {}
  ~PipeConsoleSink() override;
  PipeConsoleSink(const PipeConsoleSink&) = delete;
  PipeConsoleSink& operator=(const PipeConsoleSink&) = delete;

 protected:
  void sink_it_(const spdlog::details::log_msg& msg) override;
  // Says what was dropped, when lines were (the run's end flushes the log: lines dropped after
  // the last one written are said then).
  void flush_() override;

 private:
  // Writes all of [p, p + n) unless the pipe stays full past `wait_ms` (or the reader is gone);
  // returns the bytes written.
  size_t write_within(const char* p, size_t n, int wait_ms);
  // Writes the dropped-bytes line (within wait_ms) and clears the count; false when it did not fit.
  bool say_dropped(int wait_ms);

  int fd_;
  size_t dropped_ = 0;  // bytes not written since the last line that was
};

// A PipeConsoleSink on standard error when it is a pipe (or FIFO) and a non-blocking
// descriptor of it can be opened (a new open file description: the reader's side and other
// writers keep theirs, blocking); nullptr otherwise (a terminal, a file, /dev/null).
std::shared_ptr<PipeConsoleSink> pipe_console_sink();

}  // namespace dtrain
