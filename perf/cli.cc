// Command-line values and table cells shared by the perf and peer programs (see cli.h).
#include "perf/cli.h"

#include <cctype>
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

std::optional<int> findName(const char* text, const char* const* names, int count) {
  for (int i = 0; i < count; i++)
    if (strcmp(text, names[i]) == 0) return i;
  return std::nullopt;
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
