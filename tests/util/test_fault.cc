#include <doctest/doctest.h>

#include <string>

#include "util/check.h"
#include "util/fault.h"

using namespace dtrain;

TEST_CASE("DTRAIN_FAULT parses kill, kill_in_save, drop and delay") {
  const auto f = parse_faults(
      "kill:rank=1:step=35,kill_in_save:step=20:rank=0,drop:rank=2:step=7,delay:rank=1:ms=500", 0);
  REQUIRE(f.size() == 4);
  CHECK(f[0].kind == "kill");
  CHECK(f[0].rank == 1);
  CHECK(f[0].step == 35);
  CHECK(f[1].kind == "kill_in_save");
  CHECK(f[1].rank == 0);
  CHECK(f[1].step == 20);
  CHECK(f[2].kind == "drop");
  CHECK(f[2].rank == 2);
  CHECK(f[2].step == 7);
  CHECK(f[3].kind == "delay");
  CHECK(f[3].rank == 1);
  CHECK(f[3].ms == 500);

  CHECK(fault_due(f, "kill", 1, 35));
  CHECK_FALSE(fault_due(f, "kill", 1, 34));
  CHECK_FALSE(fault_due(f, "kill", 0, 35));
  CHECK(fault_due(f, "drop", 2, 7));
  CHECK_FALSE(fault_due(f, "drop", 1, 7));
  CHECK(fault_delay_ms(f, 1) == 500);
  CHECK(fault_delay_ms(f, 0) == 0);
  // Two delays for one rank add up.
  CHECK(fault_delay_ms(parse_faults("delay:rank=0:ms=5,delay:rank=0:ms=7", 0), 0) == 12);
  CHECK(parse_faults("", 0).empty());
}

TEST_CASE("DTRAIN_FAULT fires in the first attempt only, and is checked in every attempt") {
  const std::string spec = "kill:rank=1:step=3,delay:rank=0:ms=10";
  CHECK(parse_faults(spec, 0).size() == 2);
  for (int64_t attempt : {1, 2, 7}) {
    const auto f = parse_faults(spec, attempt);
    CHECK(f.empty());
    CHECK_FALSE(fault_due(f, "kill", 1, 3));
    CHECK(fault_delay_ms(f, 0) == 0);
  }
  CHECK_THROWS_AS(parse_faults("kill:rank=x:step=3", 1), UserError);
}

TEST_CASE("malformed DTRAIN_FAULT entries are user errors naming the entry") {
  auto message = [](const std::string& spec) {
    try {
      parse_faults(spec, 0);
    } catch (const UserError& e) {
      return std::string(e.what());
    }
    return std::string("no error");
  };
  CHECK(message("explode:rank=1:step=2").find("unknown fault 'explode'") != std::string::npos);
  CHECK(message("kill:rank=1").find("needs rank=R and step=S") != std::string::npos);
  CHECK(message("drop:step=4").find("'drop:step=4' needs rank=R and step=S") != std::string::npos);
  CHECK(message("delay:rank=1").find("needs rank=R and ms=M") != std::string::npos);
  // Each kind takes its own fields only.
  CHECK(message("delay:rank=1:step=3").find("unknown field 'step'") != std::string::npos);
  CHECK(message("kill:rank=1:step=3:ms=4").find("unknown field 'ms'") != std::string::npos);
  for (const char* bad :
       {"kill:rank=-1:step=2", "kill:rank=1:step=2x", "kill:rank=:step=2", "delay:rank=1:ms=+5",
        "delay:rank=1:ms= 5", "drop:rank=1:step", "delay:rank=1:ms=99999999999999999999"})
    CHECK_MESSAGE(message(bad).find("non-negative integer") != std::string::npos, bad);
  CHECK(message("kill:rank=1:step=2,").find("unknown fault ''") != std::string::npos);
  // A field given twice (the last one silently won).
  CHECK(message("kill:rank=1:step=3:rank=0")
            .find("'rank' is given twice in "
                  "'kill:rank=1:step=3:rank=0'") != std::string::npos);
}

TEST_CASE("a DTRAIN_FAULT on a rank the run does not have is refused: it would never fire") {
  const auto faults = parse_faults("kill:rank=5:step=3", 0);
  CHECK_NOTHROW(check_fault_ranks(faults, 6));
  CHECK_THROWS_WITH_AS(check_fault_ranks(faults, 2),
                       "DTRAIN_FAULT: the kill fault names rank 5, but the run has 2 rank(s), "
                       "0..1: it would never fire",
                       UserError);
}

TEST_CASE("a DTRAIN_FAULT step that never comes: step 0 refused, past the run's steps named") {
  CHECK_THROWS_WITH_AS(parse_faults("kill:rank=1:step=0", 0),
                       "DTRAIN_FAULT: 'step=0' in 'kill:rank=1:step=0': steps count from 1 "
                       "(step=0 would never fire)",
                       UserError);
  const auto faults = parse_faults("delay:rank=0:ms=5,grad_scale:rank=1:step=9", 0);
  CHECK(fault_past(faults, 9).empty());
  CHECK(fault_past(faults, 8) ==
        "DTRAIN_FAULT: the grad_scale fault is at step 9, past the last of the 8 step(s): it "
        "would never fire");
}

TEST_CASE("a checkpoint-write DTRAIN_FAULT on a rank that writes no file is named") {
  // One-file checkpoints are rank 0's alone: a save fault on rank 1 passed a restart drill
  // without testing anything. Sharded checkpoints run every rank's save faults.
  for (const char* kind :
       {"kill_in_save:rank=1:step=2", "fail_in_save:rank=2:step=2", "slow_save:rank=1:ms=5"}) {
    CAPTURE(kind);
    const auto faults = parse_faults(kind, 0);
    CHECK(fault_unfired_save(faults, false).empty());
    CHECK(fault_unfired_save(faults, true).find("which rank 0 writes alone") != std::string::npos);
  }
  CHECK(fault_unfired_save(parse_faults("kill_in_save:rank=0:step=2,kill:rank=1:step=2", 0), true)
            .empty());
}

TEST_CASE("DTRAIN_RESTART_COUNT is a non-negative integer, 0 when unset") {
  CHECK(parse_restart_count(nullptr) == 0);
  CHECK(parse_restart_count("0") == 0);
  CHECK(parse_restart_count("3") == 3);
  CHECK_THROWS_AS(parse_restart_count(""), UserError);
  CHECK_THROWS_AS(parse_restart_count("-1"), UserError);
  CHECK_THROWS_AS(parse_restart_count("1x"), UserError);
}
