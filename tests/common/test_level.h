// How much of the test matrices to run. By default (CI) the suites keep every collective, type, op and rank count,
// but run the largest counts and the variants (protocols, channels, a transport's options, the alternative
// algorithms) at a few rank counts only. LOOM_TEST_FULL=1 (tools/test --full) runs all of it.
#pragma once

#include <cstdlib>
#include <cstring>

namespace loomtest {

inline bool fullMatrix() {
  const char* value = std::getenv("LOOM_TEST_FULL");
  return value != nullptr && std::strcmp(value, "1") == 0;
}

}  // namespace loomtest
