// How dtrain's processes end: the dtrain binary's main and the test binaries' alike.
#pragma once

namespace dtrain {

// Flushes std::cout, std::cerr, spdlog's default logger and every C stream, runs LeakSanitizer's
// check in a sanitizer build, then ends the process with status rc through _Exit: the libraries'
// exit handlers and static destructors are skipped. Reasons: OpenBLAS's handler joins its worker
// threads, and one stuck retrying a buffer it cannot map (an address-space limit, ulimit -v)
// never returns, so the process hung after its last word; gRPC's global teardown races its own
// threads still tearing down the streams of a transport that was aborted (a refcount assertion,
// `ref_counted.h: prior > 0`, aborted a test binary after its checks had passed). Everything
// dtrain owns is closed by its scopes before this call. Thread-safe as _Exit is.
[[noreturn]] void quick_exit_flushed(int rc);

}  // namespace dtrain
