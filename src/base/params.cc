// Definitions of the params.def accessors: the only place loom reads its environment.
#include "src/base/params.h"

#include <cerrno>
#include <cstdlib>

#include "src/base/log.h"

namespace loom::params {
namespace {

Int parseInt(const char* env, Int fallback) {
  const char* text = std::getenv(env);
  if (text == nullptr || *text == '\0') return fallback;
  errno = 0;
  char* end = nullptr;
  long long value = std::strtoll(text, &end, 0);
  if (errno != 0 || end == text || *end != '\0') {
    LOOM_WARN(INIT, "%s=\"%s\" is not an integer; using the default %lld", env, text, (long long)fallback);
    return fallback;
  }
  return value;
}

Str parseStr(const char* env, const char* fallback) {
  const char* text = std::getenv(env);
  return (text == nullptr || *text == '\0') ? Str(fallback) : Str(text);
}

Int read(const char* env, Int, Int def) { return parseInt(env, def); }
Str read(const char* env, const Str&, const char* def) { return parseStr(env, def); }

}  // namespace

#define LOOM_PARAM(name, env, type, def, doc) \
  type name() { return read(env, type{}, def); }
#include "params.def"
#undef LOOM_PARAM

std::span<const ParamInfo> all() {
  static const ParamInfo kTable[] = {
#define LOOM_PARAM(name, env, type, def, doc) {env, #type, #def, doc},
#include "params.def"
#undef LOOM_PARAM
  };
  return kTable;
}

}  // namespace loom::params
