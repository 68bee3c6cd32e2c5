// fail() and the per-thread last error message.
#include "src/core/check.h"

#include <cstdarg>
#include <cstdio>

namespace loom {
namespace {
thread_local std::string tLastError;
}

loomResult_t fail(loomResult_t code, Subsys subsys, const char* fmt, ...) {
  char text[1024];
  va_list args;
  va_start(args, fmt);
  std::vsnprintf(text, sizeof(text), fmt, args);
  va_end(args);
  tLastError = text;
  // Invalid arguments are the caller's business: they are returned with a message, and logged at INFO only.
  LogLevel level = (code == loomInvalidArgument || code == loomInvalidUsage) ? LogLevel::kInfo : LogLevel::kWarn;
  if (logEnabled(level, subsys)) logMessage(level, subsys, "%s (%s)", text, loomGetErrorString(code));
  return code;
}

const std::string& threadLastError() { return tLastError; }
void clearThreadLastError() { tLastError.clear(); }

}  // namespace loom
