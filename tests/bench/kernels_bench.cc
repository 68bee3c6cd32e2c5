// Throughput of the host kernels a collective spends its time in, beside memcpy on the same buffers: every
// reduction (type x operator, out of place and in place) and the avg divide, at a size that stays in the caches
// (256 KiB per operand) and one that does not (32 MiB). Bytes counted are memory traffic: reads plus writes
// (3 x for a reduction, 2 x for a copy or divide), so every row compares with memcpy's and with memory bandwidth.
// Single thread. Run: build/tests/bench/kernels_bench [--benchmark_filter=float]
#include <benchmark/benchmark.h>

#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "src/base/dtype.h"
#include "src/exec/reduce.h"

namespace loom {
namespace {

constexpr size_t kSizes[] = {size_t{256} << 10, size_t{32} << 20};  // bytes per operand
constexpr const char* kOpNames[loomNumOps] = {"sum", "prod", "max", "min", "avg"};

// Operands of 0x01 bytes: a small normal number in every floating format and a small integer, so that no
// number of repeated reductions reaches inf or NaN (prod of such values shrinks to zero, which is fine).
struct Buffers {
  explicit Buffers(size_t bytes) : a(bytes, 0x01), b(bytes, 0x01), dst(bytes, 0) {}
  std::vector<uint8_t> a, b, dst;
};

void benchReduce(benchmark::State& state, loomDataType_t type, loomRedOp_t op, size_t bytes, bool inPlace) {
  const size_t count = bytes / dtypeSize(type);
  Buffers buffers(bytes);
  const ReduceFn reduce = reduceFunction(type, op);
  void* dst = inPlace ? buffers.a.data() : buffers.dst.data();
  for (auto _ : state) {
    reduce(dst, buffers.a.data(), buffers.b.data(), count);
    benchmark::ClobberMemory();
  }
  state.SetBytesProcessed(static_cast<int64_t>(state.iterations()) * static_cast<int64_t>(3 * bytes));
}

void benchDivide(benchmark::State& state, loomDataType_t type, size_t bytes) {
  Buffers buffers(bytes);
  for (auto _ : state) {
    divideInPlace(buffers.a.data(), bytes / dtypeSize(type), type, 2);
    std::memset(buffers.a.data(), 0x01, 64);  // keep the leading values from decaying to zero
    benchmark::ClobberMemory();
  }
  state.SetBytesProcessed(static_cast<int64_t>(state.iterations()) * static_cast<int64_t>(2 * bytes));
}

void benchMemcpy(benchmark::State& state, size_t bytes) {
  Buffers buffers(bytes);
  for (auto _ : state) {
    std::memcpy(buffers.dst.data(), buffers.a.data(), bytes);
    benchmark::ClobberMemory();
  }
  state.SetBytesProcessed(static_cast<int64_t>(state.iterations()) * static_cast<int64_t>(2 * bytes));
}

std::string sizeName(size_t bytes) {
  return bytes >= (1 << 20) ? std::to_string(bytes >> 20) + "MiB" : std::to_string(bytes >> 10) + "KiB";
}

void registerAll() {
  for (size_t bytes : kSizes) {
    benchmark::RegisterBenchmark(("memcpy/" + sizeName(bytes)).c_str(), benchMemcpy, bytes);
    for (int t = 0; t < loomNumTypes; ++t) {
      auto type = static_cast<loomDataType_t>(t);
      for (int o = 0; o < loomNumOps; ++o) {
        if (o == loomAvg) continue;  // avg runs the sum kernel, then the divide below
        for (bool inPlace : {false, true}) {
          std::string name = std::string("reduce/") + dtypeName(type) + "/" + kOpNames[o] + (inPlace ? "/inplace/" : "/") +
                             sizeName(bytes);
          benchmark::RegisterBenchmark(name.c_str(), benchReduce, type, static_cast<loomRedOp_t>(o), bytes, inPlace);
        }
      }
      benchmark::RegisterBenchmark((std::string("divide/") + dtypeName(type) + "/" + sizeName(bytes)).c_str(),
                                   benchDivide, type, bytes);
    }
  }
}

}  // namespace
}  // namespace loom

int main(int argc, char** argv) {
  benchmark::Initialize(&argc, argv);
  if (benchmark::ReportUnrecognizedArguments(argc, argv)) return 1;
  loom::registerAll();
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  return 0;
}
