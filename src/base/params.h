// Accessors for loom's tunables, generated from params.def. Each accessor reads its environment variable on
// every call (cheap, and lets tests change a setting between communicators); the default applies when the
// variable is unset or empty.
#pragma once

#include <cstdint>
#include <span>
#include <string>

namespace loom::params {

using Int = int64_t;
using Str = std::string;

#define LOOM_PARAM(name, env, type, def, doc) type name();
#include "params.def"
#undef LOOM_PARAM

struct ParamInfo {
  const char* env;
  const char* type;
  const char* defaultText;
  const char* doc;
};

// Every row of the table, in table order.
std::span<const ParamInfo> all();

}  // namespace loom::params
