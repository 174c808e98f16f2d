// Catching a UserError's message in tests: what a refusal says is part of its contract.
#pragma once

#include <doctest/doctest.h>

#include <string>

#include "util/check.h"

namespace dtrain::testing {

// The message of the UserError `fn` throws; "" when it returns (any other exception propagates
// and fails the test).
template <typename F>
std::string user_error_of(F&& fn) {
  try {
    fn();
  } catch (const UserError& e) {
    return e.what();
  }
  return "";
}

// The same for a call that must be refused: a test failure when `fn` returns.
template <typename F>
std::string user_error(F&& fn) {
  try {
    fn();
  } catch (const UserError& e) {
    return e.what();
  }
  FAIL("expected a UserError");
  return "";
}

}  // namespace dtrain::testing
