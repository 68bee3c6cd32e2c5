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
using Enum = std::string;  // the table's spelling of the word given, matched in any case
using List = std::string;  // a comma list of such words, in the order given

#define LOOM_PARAM(name, env, type, def, accepts, doc) type name();
#include "params.def"
#undef LOOM_PARAM

struct ParamInfo {
  const char* env;
  const char* type;
  const char* defaultText;
  const char* accepts;
  const char* doc;
};

// Every row of the table, in table order.
std::span<const ParamInfo> all();

// Checks every variable of the table that is set: false, with one line per bad variable in *why (each naming the
// variable, its value and what it accepts), when an Int is not an integer or an Enum or List word is not one the
// table accepts. Out-of-range integers are not errors: their accessors clamp them, with one WARN.
bool check(std::string* why);
// check() for one variable: "" when `env` is unset or well formed, else the message check() would give. For code
// that reads a setting outside a communicator's init (the bootstrap's listening socket, for loomGetUniqueId).
std::string problem(const char* env);

// "A, B or C" for an Enum's or List's accepted values, "2..64" style for an Int's; for messages and --help.
std::string describeAccepted(const ParamInfo& param);

}  // namespace loom::params
