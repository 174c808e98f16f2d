// DTRAIN_FAULT kill_in_connect: a rank dying at a named point of the gRPC setup.
#include <doctest/doctest.h>

#include <string>

#include "util/check.h"
#include "util/fault.h"

using namespace dtrain;

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

  auto refused = [](const std::string& spec, const char* why) {
    CHECK_THROWS_WITH_AS(parse_faults(spec, 0), doctest::Contains(why), UserError);
  };
  refused("kill_in_connect:rank=1", "needs rank=R and at=joined|channels|streams");
  refused("kill_in_connect:rank=1:at=later", "expected at=joined");
  refused("kill_in_connect:rank=1:step=2", "unknown field 'step'");
  refused("kill:rank=1:step=2:at=joined", "non-negative integer");
}
