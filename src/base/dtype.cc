// Sizes and names of loom's element types and reduction operators. The names are those nccl-tests prints, so
// loom's perf output can be compared line for line. The fp16 / bf16 conversions are inline in dtype.h.
#include "src/base/dtype.h"

namespace loom {

namespace {

struct TypeInfo {
  size_t size;
  const char* name;
};

// Indexed by loomDataType_t; the static_assert keeps it in step with the public enum.
constexpr TypeInfo kTypes[] = {
    {1, "int8"},   {1, "uint8"}, {4, "int32"}, {4, "uint32"}, {8, "int64"},
    {8, "uint64"}, {2, "half"},  {4, "float"}, {8, "double"}, {2, "bfloat16"},
};
static_assert(sizeof(kTypes) / sizeof(kTypes[0]) == loomNumTypes, "kTypes must list every loomDataType_t");

constexpr const char* kOpNames[] = {"sum", "prod", "max", "min", "avg"};
static_assert(sizeof(kOpNames) / sizeof(kOpNames[0]) == loomNumOps, "kOpNames must list every loomRedOp_t");

}  // namespace

bool dtypeValid(int type) { return type >= 0 && type < loomNumTypes; }

bool opValid(int op) { return op >= 0 && op < loomNumOps; }

size_t dtypeSize(loomDataType_t type) { return dtypeValid(type) ? kTypes[type].size : 0; }

const char* dtypeName(loomDataType_t type) { return dtypeValid(type) ? kTypes[type].name : "unknown"; }

const char* opName(loomRedOp_t op) { return opValid(op) ? kOpNames[op] : "unknown"; }

}  // namespace loom
