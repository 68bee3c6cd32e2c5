// Throughput of the host sum kernels for float, half and bfloat16 on 1M elements, out of place and in place
// (dst == a). Bytes counted are two reads and one write per element, so the figure compares with memory
// bandwidth. Single thread; the working set (6 or 12 MB) sits in L2/L3 on most servers, so this measures the
// kernels, not DRAM.
#include <benchmark/benchmark.h>

#include <cstdint>
#include <vector>

#include "src/core/dtype.h"
#include "src/exec/reduce.h"

namespace loom {
namespace {

constexpr size_t kCount = 1 << 20;

void benchSum(benchmark::State& state, loomDataType_t type, bool inPlace) {
  const size_t bytes = kCount * dtypeSize(type);
  // Inputs of ones in every type: 0x01 bytes are a small normal number in each format, so nothing overflows
  // into inf or NaN however many iterations run.
  std::vector<uint8_t> a(bytes, 0x01), b(bytes, 0x01), dst(bytes, 0);
  const ReduceFn sum = reduceFunction(type, loomSum);
  for (auto _ : state) {
    if (inPlace) {
      sum(a.data(), a.data(), b.data(), kCount);
    } else {
      sum(dst.data(), a.data(), b.data(), kCount);
    }
    benchmark::ClobberMemory();
  }
  state.SetBytesProcessed(static_cast<int64_t>(state.iterations()) * static_cast<int64_t>(3 * bytes));
  state.SetLabel(dtypeName(type));
}

BENCHMARK_CAPTURE(benchSum, float, loomFloat32, false);
BENCHMARK_CAPTURE(benchSum, half, loomFloat16, false);
BENCHMARK_CAPTURE(benchSum, bfloat16, loomBfloat16, false);
BENCHMARK_CAPTURE(benchSum, float_inplace, loomFloat32, true);
BENCHMARK_CAPTURE(benchSum, half_inplace, loomFloat16, true);
BENCHMARK_CAPTURE(benchSum, bfloat16_inplace, loomBfloat16, true);

}  // namespace
}  // namespace loom
