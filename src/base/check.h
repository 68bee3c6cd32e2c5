// loom's one error model inside the library: functions return loomResult_t; the function that first detects
// an error calls fail(), which logs it at WARN and records the message as this thread's last error. The public
// entry points copy that message to the communicator, where loomGetLastError finds it.
#pragma once

#include <string>

#include "loom/loom.h"
#include "src/base/log.h"

namespace loom {

// Formats the message, logs it under `subsys`, stores it as this thread's last error and returns `code`.
loomResult_t fail(loomResult_t code, Subsys subsys, const char* fmt, ...) __attribute__((format(printf, 3, 4)));
// This thread's last error message ("" when none).
const std::string& threadLastError();
void clearThreadLastError();
// Within its scope fail() logs on this thread at INFO, not WARN: for what may fail on the side, its failure
// reported otherwise (a status query to a peer that may be gone). The last error is still recorded.
class QuietFailures {
 public:
  QuietFailures();
  ~QuietFailures();
  QuietFailures(const QuietFailures&) = delete;
  QuietFailures& operator=(const QuietFailures&) = delete;

 private:
  bool saved_;
};
// Puts back a message saved from threadLastError() (after something that may fail on the side); logs nothing.
void setThreadLastError(const std::string& message);

}  // namespace loom

// Returns from the enclosing function when `call` does not succeed.
#define LOOM_CHECK(call)                                          \
  do {                                                            \
    loomResult_t loomCheckResult_ = (call);                       \
    if (loomCheckResult_ != loomSuccess) return loomCheckResult_; \
  } while (0)

#define LOOM_FAIL(code, sub, ...) ::loom::fail(code, ::loom::Subsys::sub, __VA_ARGS__)
