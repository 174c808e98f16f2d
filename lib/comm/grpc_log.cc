// gRPC's own log lines (gpr_log: "E1201 07:02:41.96 chttp2_server.cc:1045] UNKNOWN:No address
// added ...") go to spdlog at debug level instead of straight to stderr: dtrain reports every
// failure it sees in its own one-line words, and the raw lines only help when debugging.
#include <grpc/support/log.h>
#include <spdlog/spdlog.h>

#include "comm/grpc_transport.h"

namespace dtrain {
namespace {

const char* severity_name(gpr_log_severity s) {
  switch (s) {
    case GPR_LOG_SEVERITY_DEBUG:
      return "debug";
    case GPR_LOG_SEVERITY_INFO:
      return "info";
    case GPR_LOG_SEVERITY_ERROR:
      return "error";
  }
  return "?";
}

void to_spdlog(gpr_log_func_args* args) {
  spdlog::debug("grpc {} {}:{}: {}", severity_name(args->severity), args->file ? args->file : "?",
                args->line, args->message ? args->message : "");
}

}  // namespace

void route_grpc_logs_to_spdlog() {
  gpr_set_log_function(to_spdlog);
}

}  // namespace dtrain
