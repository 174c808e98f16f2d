// What the fuzz targets share. dtrain's readers take file paths, so each input is written to a
// file of this process first; and bad input may end in exactly one way, a UserError (exit 2 with
// one line for the user). Any other exception escapes the target, and libFuzzer reports it as a
// crash (uncaught exception: abort), as it does every sanitizer report, hang and OOM.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <string_view>

#include <unistd.h>

#include "util/check.h"

namespace dtrain::fuzz {

// A file in $TMPDIR (default /tmp) named after this process and `tag`, rewritten per input and
// removed at exit.
class InputFile {
 public:
  explicit InputFile(const std::string& tag) {
    const char* dir = std::getenv("TMPDIR");
    path_ = std::string(dir && *dir ? dir : "/tmp") + "/dtrain-fuzz-" + std::to_string(::getpid()) +
            "-" + tag;
  }
  ~InputFile() { std::remove(path_.c_str()); }
  InputFile(const InputFile&) = delete;
  InputFile& operator=(const InputFile&) = delete;

  // Replaces the file's content with `bytes`; returns its path.
  const std::string& write(std::string_view bytes) {
    std::FILE* f = std::fopen(path_.c_str(), "wb");
    if (f == nullptr || std::fwrite(bytes.data(), 1, bytes.size(), f) != bytes.size() ||
        std::fclose(f) != 0) {
      std::perror(path_.c_str());
      std::abort();  // the harness itself failed: not a finding
    }
    return path_;
  }

 private:
  std::string path_;
};

// Runs `fn`; a UserError is the expected answer to bad input, anything else escapes.
template <typename Fn>
void expect_user_error_at_most(Fn&& fn) {
  try {
    fn();
  } catch (const UserError&) {
  }
}

inline std::string_view as_view(const uint8_t* data, size_t size) {
  return {reinterpret_cast<const char*>(data), size};
}

}  // namespace dtrain::fuzz
