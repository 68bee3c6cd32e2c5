// Log line formatting and the LOOM_DEBUG / LOOM_DEBUG_SUBSYS filters.
#include "src/base/log.h"

#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstdio>
#include <cstring>
#include <deque>
#include <mutex>
#include <string>

#include "src/base/params.h"

namespace loom {
namespace {

constexpr const char* kSubsysNames[] = {"INIT", "BOOT", "TOPO", "TUNE", "SHM", "NET",
                                        "IB",   "UCX",  "CUDA", "COLL", "PAR"};
constexpr int kNumSubsys = sizeof(kSubsysNames) / sizeof(kSubsysNames[0]);

// Level and mask are read by every thread on every log call, without the lock: atomics, since reloadLogSettings
// (ncclResetDebugInit) may change them while other threads log. The file is used and replaced under gMutex.
struct Settings {
  std::atomic<int> level{static_cast<int>(LogLevel::kWarn)};
  std::atomic<unsigned> mask{~0u};
  FILE* out = stderr;
};

std::atomic<bool> gLoaded{false};
std::mutex gMutex;
Settings gSettings;

// The last few distinct lines printed, and how often each came again since (under gMutex). A failure met by every
// queued call says two or three lines per call, alternating: a window, not just the last line, catches them.
struct Recent {
  std::string line;
  int prefixBytes = 0;           // host:pid:rank [loom] LEVEL SUBSYS
  unsigned long long count = 0;  // repeats since it was printed
  unsigned long long said = 0;   // the count last reported
};
constexpr size_t kRecentLines = 4;
std::deque<Recent> gRecent;

// 10, 100, 1000, ...: when a count is said while a line repeats.
bool isPowerOfTen(unsigned long long n) {
  if (n < 10) return false;
  while (n % 10 == 0) n /= 10;
  return n == 1;
}

// "<prefix>repeated N times <when>: <the line's start>".
void sayRepeats(const Recent& recent, const char* when) {
  constexpr int kExcerpt = 160;
  const int body = static_cast<int>(recent.line.size()) - recent.prefixBytes - 1;  // without the newline
  std::fprintf(gSettings.out, "%.*srepeated %llu time%s %s: %.*s%s\n", recent.prefixBytes, recent.line.c_str(),
               static_cast<unsigned long long>(recent.count), recent.count == 1 ? "" : "s", when, std::min(body, kExcerpt),
               recent.line.c_str() + recent.prefixBytes, body > kExcerpt ? "..." : "");
}

void flushRecentLocked(Recent& recent) {
  if (recent.count > recent.said) sayRepeats(recent, "in all");
  recent.said = recent.count;
}

// At exit, the counts of lines still repeating.
struct FlushRepeatsAtExit {
  ~FlushRepeatsAtExit() {
    std::lock_guard<std::mutex> lock(gMutex);
    for (Recent& recent : gRecent) flushRecentLocked(recent);
    std::fflush(gSettings.out);
  }
} gFlushAtExit;
thread_local int tRank = -1;

LogLevel parseLevel(const std::string& text) {
  if (text == "NONE") return LogLevel::kNone;
  if (text == "INFO") return LogLevel::kInfo;
  if (text == "TRACE") return LogLevel::kTrace;
  return LogLevel::kWarn;
}

unsigned parseMask(std::string text) {
  bool exclude = !text.empty() && text[0] == '^';
  if (exclude) text.erase(0, 1);
  unsigned mask = 0;
  size_t start = 0;
  while (start <= text.size()) {
    size_t comma = text.find(',', start);
    std::string word = text.substr(start, comma == std::string::npos ? std::string::npos : comma - start);
    if (word == "ALL") mask = ~0u;
    for (int i = 0; i < kNumSubsys; ++i)
      if (word == kSubsysNames[i]) mask |= 1u << i;
    if (comma == std::string::npos) break;
    start = comma + 1;
  }
  return exclude ? ~mask : mask;
}

FILE* openLogFile(const std::string& pattern) {
  if (pattern.empty()) return stderr;
  char host[64] = "";
  gethostname(host, sizeof(host) - 1);
  std::string path;
  for (size_t i = 0; i < pattern.size(); ++i) {
    if (pattern[i] == '%' && i + 1 < pattern.size() && pattern[i + 1] == 'h') {
      path += host, ++i;
    } else if (pattern[i] == '%' && i + 1 < pattern.size() && pattern[i + 1] == 'p') {
      path += std::to_string(getpid()), ++i;
    } else {
      path += pattern[i];
    }
  }
  FILE* file = std::fopen(path.c_str(), "a");
  return file != nullptr ? file : stderr;
}

void loadLocked() {
  gSettings.level.store(static_cast<int>(parseLevel(params::debug())), std::memory_order_relaxed);
  gSettings.mask.store(parseMask(params::debugSubsys()), std::memory_order_relaxed);
  if (gSettings.out != stderr) std::fclose(gSettings.out);
  gSettings.out = openLogFile(params::debugFile());
  gLoaded.store(true, std::memory_order_release);
}

const Settings& settings() {
  if (!gLoaded.load(std::memory_order_acquire)) {
    std::lock_guard<std::mutex> lock(gMutex);
    if (!gLoaded.load(std::memory_order_relaxed)) loadLocked();
  }
  return gSettings;
}

}  // namespace

bool logEnabled(LogLevel level, Subsys subsys) {
  const Settings& s = settings();
  return static_cast<int>(level) <= s.level.load(std::memory_order_relaxed) &&
         (s.mask.load(std::memory_order_relaxed) >> static_cast<int>(subsys) & 1u);
}

void reloadLogSettings() {
  std::lock_guard<std::mutex> lock(gMutex);
  loadLocked();
}

void logMessageV(LogLevel level, Subsys subsys, const char* fmt, va_list args) {
  static const std::string host = [] {
    char name[64] = "";
    gethostname(name, sizeof(name) - 1);
    return std::string(name);
  }();
  const char* levelName = level == LogLevel::kWarn ? "WARN" : level == LogLevel::kInfo ? "INFO" : "TRACE";
  char line[2048];
  int used = std::snprintf(line, sizeof(line), "%s:%d:%d [loom] %s %s ", host.c_str(), (int)getpid(), tRank, levelName,
                           kSubsysNames[static_cast<int>(subsys)]);
  if (used < 0) return;
  int body = std::vsnprintf(line + used, sizeof(line) - used - 1, fmt, args);
  size_t len = body < 0 ? (size_t)used : std::min(sizeof(line) - 2, (size_t)(used + body));
  line[len] = '\n';
  line[len + 1] = '\0';
  settings();  // loaded
  std::lock_guard<std::mutex> lock(gMutex);
  // A line the same as one of the last few is counted, not printed: a failure that every poll or every queued call
  // meets again is said once, with how often it repeated (at each power of ten, and when it leaves the window).
  for (Recent& recent : gRecent) {
    if (recent.line != line) continue;
    if (isPowerOfTen(++recent.count)) {
      sayRepeats(recent, "so far");
      std::fflush(gSettings.out);
      recent.said = recent.count;
    }
    return;
  }
  if (gRecent.size() == kRecentLines) {
    flushRecentLocked(gRecent.back());
    gRecent.pop_back();
  }
  gRecent.push_front(Recent{line, used, 0, 0});
  std::fputs(line, gSettings.out);
  std::fflush(gSettings.out);
}

void logMessage(LogLevel level, Subsys subsys, const char* fmt, ...) {
  va_list args;
  va_start(args, fmt);
  logMessageV(level, subsys, fmt, args);
  va_end(args);
}

ScopedLogRank::ScopedLogRank(int rank) : saved_(tRank) { tRank = rank; }
ScopedLogRank::~ScopedLogRank() { tRank = saved_; }

}  // namespace loom
