#include "util/quick_exit.h"

#include <spdlog/spdlog.h>

#include <cstdio>
#include <cstdlib>
#include <iostream>

#if defined(__SANITIZE_ADDRESS__)
#define DTRAIN_LEAK_CHECK 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define DTRAIN_LEAK_CHECK 1
#endif
#endif
#ifdef DTRAIN_LEAK_CHECK
#include <sanitizer/lsan_interface.h>
#endif

namespace dtrain {

void quick_exit_flushed(int rc) {
  std::cout.flush();
  std::cerr.flush();
  if (auto logger = spdlog::default_logger()) logger->flush();
  std::fflush(nullptr);
#ifdef DTRAIN_LEAK_CHECK
  __lsan_do_leak_check();  // (LeakSanitizer's own check runs at exit, which _Exit skips)
#endif
  std::_Exit(rc);
}

}  // namespace dtrain
