// Definitions of the params.def accessors: the only place loom reads its environment.
#include "src/base/params.h"

#include <strings.h>

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <limits>
#include <mutex>
#include <set>
#include <string_view>
#include <vector>

#include "src/base/log.h"

namespace loom::params {
namespace {

const char* envText(const char* env) {
  const char* text = std::getenv(env);
  return (text == nullptr || *text == '\0') ? nullptr : text;
}

bool parseInteger(const char* text, Int* out) {
  errno = 0;
  char* end = nullptr;
  long long value = std::strtoll(text, &end, 0);
  if (errno != 0 || end == text || *end != '\0') return false;
  *out = value;
  return true;
}

struct Range {
  Int lo, hi;
};

// "0,1024..": the accepted integers as ranges; "" accepts every integer.
std::vector<Range> ranges(std::string_view accepts) {
  std::vector<Range> out;
  if (accepts.empty()) return {{std::numeric_limits<Int>::min(), std::numeric_limits<Int>::max()}};
  while (!accepts.empty()) {
    size_t comma = accepts.find(',');
    std::string piece(accepts.substr(0, comma));
    accepts = comma == std::string_view::npos ? std::string_view() : accepts.substr(comma + 1);
    size_t dots = piece.find("..");
    Range range{};
    if (dots == std::string::npos) {
      range.lo = range.hi = std::strtoll(piece.c_str(), nullptr, 0);
    } else {
      range.lo = std::strtoll(piece.substr(0, dots).c_str(), nullptr, 0);
      std::string high = piece.substr(dots + 2);
      range.hi = high.empty() ? std::numeric_limits<Int>::max() : std::strtoll(high.c_str(), nullptr, 0);
    }
    out.push_back(range);
  }
  return out;
}

// The accepted integer nearest to value (the lower one on a tie). A single value beside ranges ("0" of "0,1024..",
// which means "the tuner chooses") is taken only when given: values are clamped into the ranges.
Int nearestAccepted(Int value, const std::vector<Range>& accepted) {
  const bool anyRange = std::any_of(accepted.begin(), accepted.end(), [](const Range& r) { return r.lo < r.hi; });
  Int best = value;
  unsigned long long bestDistance = std::numeric_limits<unsigned long long>::max();
  for (const Range& range : accepted) {
    if (range.lo == value && range.hi == value) return value;
    if (anyRange && range.lo == range.hi) continue;
    Int candidate = value < range.lo ? range.lo : value > range.hi ? range.hi : value;
    unsigned long long distance = candidate > value ? static_cast<unsigned long long>(candidate) - value
                                                    : static_cast<unsigned long long>(value) - candidate;
    if (distance < bestDistance) best = candidate, bestDistance = distance;
  }
  return best;
}

std::vector<std::string_view> words(std::string_view accepts) {
  if (!accepts.empty() && accepts[0] == '^') accepts.remove_prefix(1);
  std::vector<std::string_view> out;
  while (!accepts.empty()) {
    size_t bar = accepts.find('|');
    out.push_back(accepts.substr(0, bar));
    accepts = bar == std::string_view::npos ? std::string_view() : accepts.substr(bar + 1);
  }
  return out;
}

// The table's spelling of word, matched in any case; nullptr-like empty view when it is not accepted.
std::string_view canonicalWord(std::string_view accepts, std::string_view word) {
  for (std::string_view candidate : words(accepts))
    if (candidate.size() == word.size() && strncasecmp(candidate.data(), word.data(), word.size()) == 0)
      return candidate;
  return {};
}

// A List's text with each word in the table's spelling; false with the first word it does not accept in *bad.
bool canonicalList(std::string_view accepts, std::string_view text, std::string* out, std::string* bad) {
  out->clear();
  if (!text.empty() && text[0] == '^' && !accepts.empty() && accepts[0] == '^') {
    out->push_back('^');  // not `*out = "^"`: GCC 12 at -O3 reports a false -Wrestrict on that assignment
    text.remove_prefix(1);
  }
  bool good = true;
  bool first = true;
  while (true) {
    size_t comma = text.find(',');
    std::string_view word = text.substr(0, comma);
    std::string_view canonical = canonicalWord(accepts, word);
    if (canonical.empty()) {
      if (good && bad != nullptr) *bad = std::string(word);
      good = false;
    } else {
      if (!first) *out += ',';
      *out += canonical;
      first = false;
    }
    if (comma == std::string_view::npos) break;
    text.remove_prefix(comma + 1);
  }
  return good;
}

std::string joinChoices(const std::vector<std::string_view>& choices) {
  std::string out;
  for (size_t i = 0; i < choices.size(); ++i) {
    if (i > 0) out += i + 1 == choices.size() ? " or " : ", ";
    out += choices[i];
  }
  return out;
}

std::string describeRanges(std::string_view accepts) {
  if (accepts.empty()) return "any integer";
  std::string text;
  for (const Range& range : ranges(accepts)) {
    if (!text.empty()) text += ", or ";
    if (range.lo == range.hi)
      text += std::to_string(range.lo);
    else if (range.hi == std::numeric_limits<Int>::max())
      text += std::to_string(range.lo) + " or more";
    else
      text += std::to_string(range.lo) + " to " + std::to_string(range.hi);
  }
  return text;
}

// Clamps and malformed integers are said once per variable and value, however often the accessor is called.
bool firstTime(const char* env, const char* text) {
  static std::mutex mutex;
  static std::set<std::string> said;
  std::lock_guard<std::mutex> lock(mutex);
  return said.insert(std::string(env) + "=" + text).second;
}

Int readInt(const char* env, Int def, const char* accepts) {
  const char* text = envText(env);
  if (text == nullptr) return def;
  Int value = 0;
  if (!parseInteger(text, &value)) {
    if (firstTime(env, text))
      LOOM_WARN(INIT, "%s=\"%s\" is not an integer (accepted: %s); using the default %lld", env, text,
                describeRanges(accepts).c_str(), static_cast<long long>(def));
    return def;
  }
  Int clamped = nearestAccepted(value, ranges(accepts));
  if (clamped != value && firstTime(env, text))
    LOOM_WARN(INIT, "%s=%s is outside %s: using %lld", env, text, describeRanges(accepts).c_str(),
              static_cast<long long>(clamped));
  return clamped;
}

// Enum and List accessors never log: the log reads LOOM_DEBUG and LOOM_DEBUG_SUBSYS through them while it sets
// itself up. A bad word is reported by check() at init.
Enum readEnum(const char* env, const char* def, const char* accepts) {
  const char* text = envText(env);
  if (text == nullptr) return def;
  std::string_view canonical = canonicalWord(accepts, text);
  return canonical.empty() ? Enum(def) : Enum(canonical);
}

List readList(const char* env, const char* def, const char* accepts) {
  const char* text = envText(env);
  if (text == nullptr) return def;
  std::string out;
  canonicalList(accepts, text, &out, nullptr);
  return out;
}

Str readStr(const char* env, const char* def, const char*) {
  const char* text = envText(env);
  return text == nullptr ? Str(def) : Str(text);
}

}  // namespace

#define LOOM_PARAM(name, env, type, def, accepts, doc) \
  type name() { return read##type(env, def, accepts); }
#include "params.def"
#undef LOOM_PARAM

std::span<const ParamInfo> all() {
  static const ParamInfo kTable[] = {
#define LOOM_PARAM(name, env, type, def, accepts, doc) {env, #type, #def, accepts, doc},
#include "params.def"
#undef LOOM_PARAM
  };
  return kTable;
}

std::string describeAccepted(const ParamInfo& param) {
  std::string_view type = param.type;
  if (type == "Int") return describeRanges(param.accepts);
  if (type == "Enum") return joinChoices(words(param.accepts)) + " (any case)";
  if (type == "List") {
    std::string text = "a comma list of " + joinChoices(words(param.accepts)) + " (any case)";
    if (param.accepts[0] == '^') text += "; a leading ^ excludes the listed ones";
    return text;
  }
  return "text";
}

namespace {

// What is wrong with `param`'s value, or "".
std::string problemOf(const ParamInfo& param) {
  const char* text = envText(param.env);
  if (text == nullptr) return "";
  std::string_view type = param.type;
  std::string problem;
  Int ignored = 0;
  std::string canonical, bad;
  if (type == "Int" && !parseInteger(text, &ignored))
    problem = "is not an integer";
  else if (type == "Enum" && canonicalWord(param.accepts, text).empty())
    problem = "is not accepted";
  else if (type == "List" && !canonicalList(param.accepts, text, &canonical, &bad))
    problem = "has \"" + bad + "\", which is not accepted";
  if (problem.empty()) return "";
  return std::string(param.env) + "=\"" + text + "\" " + problem + ": expected " + describeAccepted(param);
}

}  // namespace

std::string problem(const char* env) {
  for (const ParamInfo& param : all())
    if (std::string_view(param.env) == env) return problemOf(param);
  return "";
}

bool check(std::string* why) {
  why->clear();
  for (const ParamInfo& param : all()) {
    const std::string found = problemOf(param);
    if (found.empty()) continue;
    if (!why->empty()) *why += "; ";
    *why += found;
  }
  return why->empty();
}

}  // namespace loom::params
