// OpenBLAS kernel choice (tensor/blas.h): on a CPU with AVX2 or AVX-512 the dtrain binary runs the
// matching kernels even where Debian 12's OpenBLAS falls back to SSE3 ("Prescott") for a CPU
// model it does not know; a user's OPENBLAS_CORETYPE is kept as given.
#include <doctest/doctest.h>

#include <nlohmann/json.hpp>

#include "test_util.h"

using dtrain::testing::run_cmd;

namespace {

const std::string kBin = DTRAIN_BIN;

std::string core_of(const std::string& env) {
  const auto r = run_cmd(env + " " + kBin + " bench gemm --iters 3");
  REQUIRE_MESSAGE(r.exit_code == 0, r.output);
  const auto j = nlohmann::json::parse(r.output.substr(r.output.rfind('{')));
  return j["blas_core"].get<std::string>();
}

}  // namespace

TEST_CASE("dtrain runs the OpenBLAS kernels of this CPU's vector unit, or the ones asked for") {
  __builtin_cpu_init();
  const std::string core = core_of("env -u OPENBLAS_CORETYPE");
  INFO("kernels: ", core);
  if (__builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
      __builtin_cpu_supports("avx512dq") && __builtin_cpu_supports("avx512vl") &&
      __builtin_cpu_supports("avx512cd")) {
    CHECK((core == "SkylakeX" || core == "Cooperlake" || core == "SapphireRapids"));
  } else if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma")) {
    CHECK(core != "Prescott");
    CHECK(core != "Sandybridge");
  }
  CHECK(core_of("OPENBLAS_CORETYPE=Prescott") == "Prescott");
  if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma"))
    CHECK(core_of("OPENBLAS_CORETYPE=Haswell") == "Haswell");
}
