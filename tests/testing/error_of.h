// The message of the error a callable throws, for tests that check what a message says.
#pragma once

#include <gtest/gtest.h>

#include <exception>
#include <string>

namespace retrace::testing {

// The message of the Kind that f throws; a test failure if it throws nothing or another kind.
template <typename Kind, typename F>
std::string error_of(F&& f) {
  try {
    f();
  } catch (const Kind& e) {
    return e.what();
  } catch (const std::exception& e) {
    ADD_FAILURE() << "threw another kind of error: " << e.what();
    return "";
  }
  ADD_FAILURE() << "threw nothing";
  return "";
}

}  // namespace retrace::testing
