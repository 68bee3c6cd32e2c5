// The CUDA kernels (exec/cuda/kernels.h) on a device against the host kernels (exec/reduce.h): every type and
// operator, counts from 1 to past a million, vector and element paths (aligned and misaligned buffers), in
// place; avg's divide; copies of odd lengths and offsets; a flat plan walked on the device as on the host. NaNs
// compare by NaN-ness (a device conversion may return another NaN payload). Exits 77 (skipped) when there is no
// CUDA device.
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <cstdio>
#include <cstring>
#include <vector>

#include "algorithms/builders.h"
#include "algorithms/flat_plan.h"
#include "src/core/dtype.h"
#include "src/exec/cuda/kernels.h"
#include "src/exec/reduce.h"
#include "tests/common/elements.h"

namespace loom {
namespace {

constexpr loomDataType_t kTypes[] = {loomInt8,  loomUint8,   loomInt32,   loomUint32,  loomInt64,
                                     loomUint64, loomFloat16, loomFloat32, loomFloat64, loomBfloat16};
constexpr size_t kCounts[] = {1, 7, 1000, (1 << 20) + 3};

// A device buffer holding `bytes` of host data at `offset` bytes past an aligned allocation.
class DeviceBuffer {
 public:
  DeviceBuffer(size_t bytes, size_t offset) : offset_(offset) {
    EXPECT_EQ(cudaMalloc(&base_, bytes + offset + 16), cudaSuccess);
  }
  ~DeviceBuffer() { cudaFree(base_); }
  void* get() const { return static_cast<char*>(base_) + offset_; }
  void upload(const std::vector<unsigned char>& data) {
    EXPECT_EQ(cudaMemcpy(get(), data.data(), data.size(), cudaMemcpyHostToDevice), cudaSuccess);
  }
  std::vector<unsigned char> download(size_t bytes) const {
    std::vector<unsigned char> data(bytes);
    EXPECT_EQ(cudaMemcpy(data.data(), get(), bytes, cudaMemcpyDeviceToHost), cudaSuccess);
    return data;
  }

 private:
  void* base_ = nullptr;
  size_t offset_;
};

size_t mismatches(loomDataType_t type, const std::vector<unsigned char>& expected,
                  const std::vector<unsigned char>& got, size_t count) {
  size_t wrong = 0;
  for (size_t i = 0; i < count; ++i) wrong += !loomtest::sameElement(type, expected.data(), got.data(), i);
  return wrong;
}

TEST(CudaKernels, ReduceMatchesTheHost) {
  for (loomDataType_t type : kTypes) {
    for (loomRedOp_t op : {loomSum, loomProd, loomMax, loomMin}) {
      for (size_t count : kCounts) {
        for (size_t misalign : {size_t{0}, dtypeSize(type)}) {
          const size_t bytes = count * dtypeSize(type);
          auto a = loomtest::randomBytes(bytes, count + type);
          auto b = loomtest::randomBytes(bytes, count * 3 + op);
          loomtest::plantSpecials(type, a, b);
          std::vector<unsigned char> expected(bytes);
          reduceFunction(type, op)(expected.data(), a.data(), b.data(), count);
          DeviceBuffer dA(bytes, misalign), dB(bytes, 0), dOut(bytes, 0);
          dA.upload(a);
          dB.upload(b);
          ASSERT_EQ(device::enqueueReduce(dOut.get(), dA.get(), dB.get(), count, type, op, nullptr), loomSuccess);
          ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
          EXPECT_EQ(mismatches(type, expected, dOut.download(bytes), count), 0u)
              << dtypeName(type) << " " << opName(op) << " count " << count << " misaligned by " << misalign;
          // In place: b = a op b.
          ASSERT_EQ(device::enqueueReduce(dB.get(), dA.get(), dB.get(), count, type, op, nullptr), loomSuccess);
          ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
          EXPECT_EQ(mismatches(type, expected, dB.download(bytes), count), 0u)
              << dtypeName(type) << " " << opName(op) << " in place, count " << count;
        }
      }
    }
  }
}

TEST(CudaKernels, DivideMatchesTheHost) {
  for (loomDataType_t type : kTypes) {
    for (size_t count : kCounts) {
      const size_t bytes = count * dtypeSize(type);
      auto expected = loomtest::randomBytes(bytes, count + 17 * type);
      DeviceBuffer data(bytes, 0);
      data.upload(expected);
      divideInPlace(expected.data(), count, type, 6);
      ASSERT_EQ(device::enqueueDivide(data.get(), count, type, 6, nullptr), loomSuccess);
      ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
      EXPECT_EQ(mismatches(type, expected, data.download(bytes), count), 0u) << dtypeName(type) << " count " << count;
    }
  }
}

TEST(CudaKernels, CopyIsExact) {
  for (size_t bytes : {size_t{1}, size_t{15}, size_t{16}, size_t{4097}, size_t{(8 << 20) + 5}}) {
    for (size_t misalign : {size_t{0}, size_t{3}}) {
      const auto data = loomtest::randomBytes(bytes, bytes);
      DeviceBuffer src(bytes, misalign), dst(bytes, 0);
      src.upload(data);
      ASSERT_EQ(device::enqueueCopy(dst.get(), src.get(), bytes, nullptr), loomSuccess);
      ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
      EXPECT_EQ(dst.download(bytes), data) << bytes << " bytes, source misaligned by " << misalign;
    }
  }
}

// A flat plan copied to the device is walked there in the host executor's order (flat_plan_test checks the same
// walk on the host, for every algorithm).
TEST(CudaKernels, PlanWalkMatchesTheHost) {
  for (const char* algorithm : {"ring", "tree", "rabenseifner"}) {
    CollArgs args;
    args.collective = Collective::kAllReduce;
    args.nranks = 4;
    args.rank = 1;
    args.count = 100003;
    args.nChannels = 2;
    RankPlan plan;
    ASSERT_TRUE(buildPlan(args, algorithm, &plan)) << algorithm;
    FlatPlan flat = flatten(plan);
    auto toDevice = [](const auto& vector) {
      void* pointer = nullptr;
      size_t bytes = vector.size() * sizeof(vector[0]);
      EXPECT_EQ(cudaMalloc(&pointer, bytes + 1), cudaSuccess);
      EXPECT_EQ(cudaMemcpy(pointer, vector.data(), bytes, cudaMemcpyHostToDevice), cudaSuccess);
      return pointer;
    };
    FlatPlanView view = flat.view();
    view.lanes = static_cast<const FlatLane*>(toDevice(flat.lanes));
    view.steps = static_cast<const Step*>(toDevice(flat.steps));
    view.phaseStarts = static_cast<const uint32_t*>(toDevice(flat.phaseStarts));
    const size_t kCapacity = 1 << 16;
    uint32_t* visits = nullptr;
    unsigned long long* count = nullptr;
    ASSERT_EQ(cudaMalloc(&visits, 2 * kCapacity * sizeof(uint32_t)), cudaSuccess);
    ASSERT_EQ(cudaMalloc(&count, sizeof(*count)), cudaSuccess);
    for (uint32_t l = 0; l < view.laneCount; ++l) {
      for (size_t slice : {size_t{64}, size_t{4099}}) {
        ASSERT_EQ(device::enqueuePlanWalk(view, l, slice, visits, kCapacity, count, nullptr), loomSuccess);
        ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
        unsigned long long visited = 0;
        ASSERT_EQ(cudaMemcpy(&visited, count, sizeof(visited), cudaMemcpyDeviceToHost), cudaSuccess);
        ASSERT_LE(visited, kCapacity);
        std::vector<uint32_t> got(2 * visited);
        ASSERT_EQ(cudaMemcpy(got.data(), visits, got.size() * sizeof(uint32_t), cudaMemcpyDeviceToHost), cudaSuccess);
        std::vector<uint32_t> want;
        auto slicesOf = [slice](const Step& step) { return sliceCount(step.count(), slice); };
        LaneCursor cursor;
        for (cursor.start(plan.lanes[l], slicesOf); !cursor.done(); cursor.next(slicesOf)) {
          want.push_back(static_cast<uint32_t>(cursor.step()));
          want.push_back(static_cast<uint32_t>(cursor.round()));
        }
        EXPECT_EQ(got, want) << algorithm << " lane " << l << " slices of " << slice;
      }
    }
    cudaFree(visits);
    cudaFree(count);
    cudaFree(const_cast<FlatLane*>(view.lanes));
    cudaFree(const_cast<Step*>(view.steps));
    cudaFree(const_cast<uint32_t*>(view.phaseStarts));
  }
}

TEST(CudaKernels, BadArgumentsAreErrors) {
  EXPECT_EQ(device::enqueueReduce(nullptr, nullptr, nullptr, 4, loomNumTypes, loomSum, nullptr), loomInvalidArgument);
  EXPECT_EQ(device::enqueueReduce(nullptr, nullptr, nullptr, 4, loomFloat32, loomNumOps, nullptr), loomInvalidArgument);
}

}  // namespace
}  // namespace loom

int main(int argc, char** argv) {
  int devices = 0;
  if (cudaGetDeviceCount(&devices) != cudaSuccess || devices == 0) {
    std::printf("no CUDA device: skipped\n");
    return 77;
  }
  testing::InitGoogleTest(&argc, argv);
  return RUN_ALL_TESTS();
}
