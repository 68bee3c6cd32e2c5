// fail() and the per-thread last error message.
#include "src/base/check.h"

#include <sys/resource.h>

#include <cerrno>
#include <cstdarg>
#include <cstdio>
#include <cstring>
#include <string>

namespace loom {
namespace {
thread_local std::string tLastError;
thread_local bool tQuiet = false;
}

QuietFailures::QuietFailures() : saved_(tQuiet) { tQuiet = true; }
QuietFailures::~QuietFailures() { tQuiet = saved_; }

loomResult_t fail(loomResult_t code, Subsys subsys, const char* fmt, ...) {
  const int cause = errno;  // what "%m" in fmt names
  char text[1024];
  va_list args;
  va_start(args, fmt);
  std::vsnprintf(text, sizeof(text), fmt, args);
  va_end(args);
  tLastError = text;
  // Out of file descriptors: say which limit to raise, whatever ran out (a socket, a segment, an accept).
  // Said once: a message that wraps another's already carries it.
  if (code == loomSystemError && (cause == EMFILE || cause == ENFILE) && std::strstr(text, "open files") != nullptr &&
      std::strstr(text, "limit on open files") == nullptr) {
    rlimit limit{};
    getrlimit(RLIMIT_NOFILE, &limit);
    tLastError += cause == EMFILE ? "; raise this process's limit on open files (ulimit -n; it is now " +
                                        std::to_string(limit.rlim_cur) + ")"
                                  : "; the system's limit on open files (fs.file-max) is reached";
  }
  // Invalid arguments are the caller's business: they are returned with a message, and logged at INFO only.
  LogLevel level =
      (code == loomInvalidArgument || code == loomInvalidUsage || tQuiet) ? LogLevel::kInfo : LogLevel::kWarn;
  if (logEnabled(level, subsys)) logMessage(level, subsys, "%s (%s)", tLastError.c_str(), loomGetErrorString(code));
  return code;
}

const std::string& threadLastError() { return tLastError; }
void clearThreadLastError() { tLastError.clear(); }
void setThreadLastError(const std::string& message) { tLastError = message; }

}  // namespace loom
