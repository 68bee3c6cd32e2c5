// Prints docs/ENVIRONMENT.md from the params table (src/base/params.def), so the page can never drift from the
// code: `build/tools/gen_env_doc > docs/ENVIRONMENT.md`. A unit test compares the committed page with this output.
#include <cstdio>
#include <string>

#include "src/base/params.h"

int main() {
  std::printf("# Environment variables\n\n");
  std::printf("Generated from `src/base/params.def` by `build/tools/gen_env_doc`; do not edit by hand.\n");
  std::printf("Every variable is read when it is needed (a communicator reads its settings at init).\n\n");
  std::printf("Enumerations are read in any case. A value that is not an integer where one is expected, or a word not\n");
  std::printf("accepted, fails every communicator's init with a message naming the variable and what it accepts; an\n");
  std::printf("integer outside its accepted values is clamped to the nearest one, said once at WARN.\n\n");
  std::printf("| Variable | Type | Default | Accepted | Meaning |\n|---|---|---|---|---|\n");
  for (const loom::params::ParamInfo& param : loom::params::all()) {
    std::string def = param.defaultText;
    if (def == "\"\"") def = "(empty)";
    const std::string kind = param.type;
    std::string type = kind == "Int" ? "integer" : kind == "Enum" ? "one word" : kind == "List" ? "list" : "string";
    std::string accepted = kind == "Str" ? "" : loom::params::describeAccepted(param);
    std::printf("| `%s` | %s | `%s` | %s | %s |\n", param.env, type.c_str(), def.c_str(), accepted.c_str(), param.doc);
  }
  return 0;
}
