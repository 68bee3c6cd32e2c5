// Command-line values, output paths and table cells shared by loom's programs (see cli.h).
#include "perf/cli.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cctype>
#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>

namespace perf {

const char* const kTypeNames[loomNumTypes] = {"int8",   "uint8", "int32", "uint32", "int64",
                                              "uint64", "half",  "float", "double", "bfloat16"};
const char* const kOpNames[loomNumOps] = {"sum", "prod", "max", "min", "avg"};

int parseIntArg(const char* text, const char* name, int min, int max) {
  char* end = nullptr;
  long value = strtol(text, &end, 0);
  if (*text == '\0' || *end != '\0' || value < min || value > max)
    throw UsageError(std::string("invalid value '") + text + "' for " + name + " (expected " + std::to_string(min) +
                     ".." + std::to_string(max) + ")");
  return static_cast<int>(value);
}

bool setIntFlag(std::span<const IntFlag> flags, int letter, const char* text) {
  for (const IntFlag& flag : flags) {
    if (flag.letter != letter) continue;
    *flag.value = parseIntArg(text, (std::string("-") + flag.letter).c_str(), flag.min, flag.max);
    return true;
  }
  return false;
}

size_t parseSizeArg(const char* text, const char* name) {
  char* end = nullptr;
  double value = strtod(text, &end);
  static const char kSuffixes[] = "KMG";
  const char* suffix = end != text && *end ? strchr(kSuffixes, toupper(static_cast<unsigned char>(*end))) : nullptr;
  double bytes = suffix ? std::ldexp(value, 10 * static_cast<int>(suffix - kSuffixes + 1)) : value;
  if (suffix) end++;
  if (end == text || *end != '\0' || !(value >= 0) || bytes > 1e18)
    throw UsageError(std::string("invalid size '") + text + "' for " + name);
  return static_cast<size_t>(bytes);
}

bool sameCollectiveName(const char* a, const char* b) {
  auto fold = [](const char* text) {
    std::string folded;
    for (; *text != '\0'; ++text)
      if (*text != '_' && *text != '-') folded += static_cast<char>(tolower(static_cast<unsigned char>(*text)));
    return folded;
  };
  return fold(a) == fold(b);
}

std::optional<int> findName(const char* text, const char* const* names, int count) {
  for (int i = 0; i < count; i++)
    if (strcmp(text, names[i]) == 0) return i;
  return std::nullopt;
}

int launcherRank() {
  for (const char* name : {"LOOM_RANK", "OMPI_COMM_WORLD_RANK", "PMI_RANK", "SLURM_PROCID", "RANK"}) {
    const char* text = getenv(name);
    if (text != nullptr && *text != '\0') return atoi(text);
  }
  return 0;
}

bool underLauncher() {
  for (const char* name : {"LOOM_RANK", "OMPI_COMM_WORLD_RANK", "PMI_RANK", "SLURM_PROCID"}) {
    if (getenv(name)) return true;
  }
  return getenv("RANK") && getenv("WORLD_SIZE");
}

bool checkOutputPath(const std::string& path, std::string* why) {
  if (path.empty()) {
    *why = "an empty file name";
    return false;
  }
  // Tried, not judged from the permission bits: root may write where the bits say no and not where a file system
  // is read-only or a folder is not real (/proc). Every rank of a job checks the same path at once, so a file that
  // another rank's probe creates or removes between two of these steps is looked at again (a few times, then the
  // last answer stands).
  int lastErrno = 0;
  for (int attempt = 0; attempt < 8; attempt++) {
    struct stat info {};
    if (stat(path.c_str(), &info) == 0) {
      if (S_ISDIR(info.st_mode)) {
        *why = path + " is a directory";
        return false;
      }
      const int fd = open(path.c_str(), O_WRONLY | O_APPEND | O_CLOEXEC);  // neither truncated nor changed
      if (fd >= 0) {
        close(fd);
        return true;
      }
      lastErrno = errno;
      if (errno == ENOENT) continue;  // another rank's probe, removed since the stat
      *why = "cannot write " + path + ": " + strerror(errno);
      return false;
    }
    const size_t slash = path.find_last_of('/');
    const std::string folder = slash == std::string::npos ? "." : slash == 0 ? "/" : path.substr(0, slash);
    if (stat(folder.c_str(), &info) != 0 || !S_ISDIR(info.st_mode)) {
      *why = "cannot write " + path + ": its folder " + folder + " does not exist";
      return false;
    }
    const int fd = open(path.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
    if (fd >= 0) {
      close(fd);
      unlink(path.c_str());  // the program writes it when it has something to write
      return true;
    }
    lastErrno = errno;
    if (errno == EEXIST) continue;  // another rank's probe, made since the stat
    *why = "cannot write " + path + ": " + strerror(errno);
    return false;
  }
  *why = "cannot write " + path + ": " + strerror(lastErrno) + " (it kept appearing and disappearing)";
  return false;
}

void exitOnce(const char* program, const std::string& message, int status) {
  if (launcherRank() == 0) {
    fprintf(stderr, "%s: %s\n", program, message.c_str());
    fflush(stderr);
  } else {
    // A launcher stops the job when its first rank exits: let rank 0, which says why, be that one.
    usleep(500 * 1000);
  }
  exit(status);
}

std::string formatCell(double value, int width) {
  char text[64];
  for (int decimals = 2; decimals >= 0; decimals--) {
    if (snprintf(text, sizeof(text), "%*.*f", width, decimals, value) <= width) return text;
  }
  snprintf(text, sizeof(text), "%*.*e", width, width >= 7 ? 1 : 0, value);
  return text;
}

}  // namespace perf
