// What every public entry point does first: count itself as inside the library, keep the communicator's last
// error current, and check its communicator, stream and buffers. For the entry points of other files (loom_ep.h).
#pragma once

#include <cstring>

#include "loom/loom.h"
#include "src/base/check.h"
#include "src/base/log.h"
#include "src/core/comm.h"

namespace loom {

// Marks a call as inside the library for its lifetime and files its error message on the communicator.
class ApiScope {
 public:
  explicit ApiScope(loomComm* comm) : comm_(comm), logRank_(comm ? comm->rank : -1) {
    clearThreadLastError();
    if (comm_) comm_->activeCalls.fetch_add(1);
  }
  ~ApiScope() {
    if (comm_) comm_->activeCalls.fetch_sub(1);
  }
  loomResult_t finish(loomResult_t result) {
    if (result != loomSuccess && comm_) comm_->setLastError(threadLastError());
    return result;
  }

 private:
  loomComm* comm_;
  ScopedLogRank logRank_;
};

// C callers may pass any int as an enum; reading it through memcpy avoids loading an out-of-range enum value
// (undefined in C++) before it is checked.
template <typename Enum>
int rawValue(const Enum& value) {
  int raw = 0;
  static_assert(sizeof(Enum) == sizeof(int));
  std::memcpy(&raw, &value, sizeof(raw));
  return raw;
}

// Checks shared by every call on a communicator: not NULL, not finalized, no pending error, a valid stream.
loomResult_t checkComm(loomComm* comm, const char* what, loomStream_t stream);
// A NULL buffer is an error when the call would touch bytes of it.
loomResult_t checkBuffer(const char* what, const char* name, const void* buffer, size_t bytes);

}  // namespace loom
