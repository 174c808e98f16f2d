// DTRAIN_FAULT kill_in_connect and stall_in_connect: a rank dying or held at a named point of
// the gRPC setup.
#include <doctest/doctest.h>

#include <string>

#include "util/check.h"
#include "util/fault.h"

using namespace dtrain;

namespace {

void refused(const std::string& spec, const char* why) {
  CHECK_THROWS_WITH_AS(parse_faults(spec, 0), doctest::Contains(why), UserError);
}

}  // namespace

TEST_CASE("DTRAIN_FAULT kill_in_connect names a rank and a setup point") {
  const auto f = parse_faults("kill_in_connect:rank=2:at=channels,kill:rank=1:step=3", 0);
  REQUIRE(f.size() == 2);
  CHECK(f[0].kind == "kill_in_connect");
  CHECK(f[0].rank == 2);
  CHECK(f[0].at == "channels");
  CHECK(fault_due_at(f, "kill_in_connect", 2, "channels"));
  CHECK_FALSE(fault_due_at(f, "kill_in_connect", 2, "joined"));
  CHECK_FALSE(fault_due_at(f, "kill_in_connect", 1, "channels"));
  CHECK(parse_faults("kill_in_connect:rank=0:at=joined", 1).empty());  // first attempt only

  refused("kill_in_connect:rank=1", "needs rank=R and at=joined|channels|streams");
  refused("kill_in_connect:rank=1:at=later", "expected at=joined");
  refused("kill_in_connect:rank=1:step=2", "unknown field 'step'");
  refused("kill:rank=1:step=2:at=joined", "non-negative integer");
}

TEST_CASE("DTRAIN_FAULT stall_in_connect holds a rank at a setup point for a time") {
  const auto f = parse_faults("stall_in_connect:rank=2:at=channels:ms=700", 0);
  REQUIRE(f.size() == 1);
  CHECK(fault_stall_ms(f, 2, "channels") == 700);
  CHECK(fault_stall_ms(f, 2, "streams") == 0);
  CHECK(fault_stall_ms(f, 1, "channels") == 0);
  CHECK_FALSE(fault_due_at(f, "kill_in_connect", 2, "channels"));  // a stall is not a kill
  CHECK(parse_faults("stall_in_connect:rank=2:at=channels:ms=700", 1).empty());
  refused("stall_in_connect:rank=1:at=joined", "needs rank=R, at=joined|channels|streams and ms=M");
  refused("stall_in_connect:rank=1:ms=5", "needs rank=R, at=joined|channels|streams and ms=M");
  refused("stall_in_connect:rank=1:at=joined:ms=-5", "non-negative integer");
  refused("stall_in_connect:rank=1:at=joined:ms=5:step=1", "unknown field 'step'");
}
