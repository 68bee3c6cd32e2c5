// The CUDA kernels' element arithmetic (exec/cuda/element_ops.h), compiled for the host, against the host
// reduction kernels (exec/reduce.h): every type and operator, bit for bit on random bit patterns (any NaN for a
// NaN: which operand's payload a NaN sum keeps depends on the operand order the compiler picks); and avg's
// divide. The kernels themselves run on a GPU only (tests/gpu/kernels_test.cc); this is the part of them a
// machine without one can check.
#include "src/exec/cuda/element_ops.h"

#include <gtest/gtest.h>

#include <cstring>
#include <string>
#include <vector>

#include "src/base/dtype.h"
#include "src/exec/reduce.h"
#include "tests/common/elements.h"

namespace loom {
namespace {

constexpr size_t kCount = 1 << 16;

template <loomDataType_t kType, typename Op>
void combineAll(void* dst, const void* a, const void* b, size_t count) {
  using Storage = typename device::FormatOf<kType>::Storage;
  for (size_t i = 0; i < count; ++i) {
    Storage x, y;
    std::memcpy(&x, static_cast<const Storage*>(a) + i, sizeof x);
    std::memcpy(&y, static_cast<const Storage*>(b) + i, sizeof y);
    Storage z = device::combine<kType, Op>(x, y);
    std::memcpy(static_cast<Storage*>(dst) + i, &z, sizeof z);
  }
}

template <loomDataType_t kType>
void divideAll(void* data, size_t count, int divisor) {
  using Storage = typename device::FormatOf<kType>::Storage;
  for (size_t i = 0; i < count; ++i) {
    Storage x;
    std::memcpy(&x, static_cast<Storage*>(data) + i, sizeof x);
    x = device::divide<kType>(x, divisor);
    std::memcpy(static_cast<Storage*>(data) + i, &x, sizeof x);
  }
}

template <loomDataType_t kType>
void checkType() {
  const size_t bytes = kCount * dtypeSize(kType);
  auto a = loomtest::randomBytes(bytes, 1 + kType);
  auto b = loomtest::randomBytes(bytes, 100 + kType);
  loomtest::plantSpecials(kType, a, b);
  std::vector<unsigned char> expected(bytes), got(bytes);
  auto compare = [&](const char* what) {
    size_t wrong = 0;
    for (size_t i = 0; i < kCount; ++i) wrong += !loomtest::sameElement(kType, expected.data(), got.data(), i);
    EXPECT_EQ(wrong, 0u) << dtypeName(kType) << " " << what << ": elements that differ";
  };
  for (loomRedOp_t op : {loomSum, loomProd, loomMax, loomMin}) {
    reduceFunction(kType, op)(expected.data(), a.data(), b.data(), kCount);
    switch (op) {
      case loomSum:
        combineAll<kType, device::SumOp>(got.data(), a.data(), b.data(), kCount);
        break;
      case loomProd:
        combineAll<kType, device::ProdOp>(got.data(), a.data(), b.data(), kCount);
        break;
      case loomMax:
        combineAll<kType, device::MaxOp>(got.data(), a.data(), b.data(), kCount);
        break;
      default:
        combineAll<kType, device::MinOp>(got.data(), a.data(), b.data(), kCount);
        break;
    }
    compare(opName(op));
  }
  for (int divisor : {2, 3, 7, 200}) {
    expected = a;
    got = a;
    divideInPlace(expected.data(), kCount, kType, divisor);
    divideAll<kType>(got.data(), kCount, divisor);
    compare(("avg divide by " + std::to_string(divisor)).c_str());
  }
}

TEST(DeviceOps, MatchTheHostKernels) {
  checkType<loomInt8>();
  checkType<loomUint8>();
  checkType<loomInt32>();
  checkType<loomUint32>();
  checkType<loomInt64>();
  checkType<loomUint64>();
  checkType<loomFloat16>();
  checkType<loomFloat32>();
  checkType<loomFloat64>();
  checkType<loomBfloat16>();
}

}  // namespace
}  // namespace loom
