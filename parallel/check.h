// The parallel layer's error model: it is an application of loom, so a failed loom call ends the program with
// loom's message (STYLE.md: the application layer may check and exit).
#pragma once

#include <cstdio>
#include <cstdlib>

#include "loom/loom.h"

namespace loom::parallel {

[[noreturn]] inline void loomFailed(loomResult_t result, loomComm_t comm, const char* call, const char* file,
                                    int line) {
  std::fprintf(stderr, "%s:%d: %s failed: %s: %s\n", file, line, call, loomGetErrorString(result),
               loomGetLastError(comm));
  std::exit(1);
}

}  // namespace loom::parallel

// Runs a loom call on `comm`; on failure prints the call, loom's error and its last message, and exits.
#define LOOM_PAR_CHECK(comm, call)                                                     \
  do {                                                                                 \
    loomResult_t loomParResult_ = (call);                                              \
    if (loomParResult_ != loomSuccess)                                                 \
      ::loom::parallel::loomFailed(loomParResult_, (comm), #call, __FILE__, __LINE__); \
  } while (0)
