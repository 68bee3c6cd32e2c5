// Logging: LOOM_DEBUG sets the level, LOOM_DEBUG_SUBSYS the subsystems. Every line is prefixed with host, pid
// and the rank the calling thread is working for (set with ScopedLogRank).
#pragma once

#include <cstdarg>

namespace loom {

enum class LogLevel { kNone = 0, kWarn = 1, kInfo = 2, kTrace = 3 };
enum class Subsys { INIT, BOOT, TOPO, TUNE, SHM, NET, IB, UCX, CUDA, COLL, PAR };

bool logEnabled(LogLevel level, Subsys subsys);
void logMessage(LogLevel level, Subsys subsys, const char* fmt, ...) __attribute__((format(printf, 3, 4)));
void logMessageV(LogLevel level, Subsys subsys, const char* fmt, va_list args);
// Re-reads LOOM_DEBUG and LOOM_DEBUG_SUBSYS (they are otherwise read once).
void reloadLogSettings();

// Sets the rank shown in this thread's log lines for the scope's lifetime.
class ScopedLogRank {
 public:
  explicit ScopedLogRank(int rank);
  ~ScopedLogRank();
  ScopedLogRank(const ScopedLogRank&) = delete;
  ScopedLogRank& operator=(const ScopedLogRank&) = delete;

 private:
  int saved_;
};

}  // namespace loom

#define LOOM_LOG_(level, sub, ...)                                                                                   \
  do {                                                                                                               \
    if (::loom::logEnabled(level, ::loom::Subsys::sub)) ::loom::logMessage(level, ::loom::Subsys::sub, __VA_ARGS__); \
  } while (0)
#define LOOM_WARN(sub, ...) LOOM_LOG_(::loom::LogLevel::kWarn, sub, __VA_ARGS__)
#define LOOM_INFO(sub, ...) LOOM_LOG_(::loom::LogLevel::kInfo, sub, __VA_ARGS__)
#define LOOM_TRACE(sub, ...) LOOM_LOG_(::loom::LogLevel::kTrace, sub, __VA_ARGS__)
