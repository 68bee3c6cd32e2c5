// Tensor storage and views (tensor.h).
#include "parallel/tensor.h"

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>

#include "parallel/kernels/ops.h"

namespace loom::parallel {
namespace {

size_t countOf(const std::vector<int64_t>& shape) {
  size_t count = 1;
  for (int64_t extent : shape) {
    if (extent < 0) {
      std::fprintf(stderr, "tensor: negative extent %lld in a shape\n", static_cast<long long>(extent));
      std::abort();
    }
    count *= static_cast<size_t>(extent);
  }
  return count;
}

[[noreturn]] void wrongType(const Tensor& tensor, const char* wanted) {
  std::fprintf(stderr, "tensor: %s read as %s\n", tensor.describe().c_str(), wanted);
  std::abort();
}

}  // namespace

size_t dtypeBytes(DType dtype) {
  switch (dtype) {
    case DType::kFloat32:
    case DType::kInt32:
      return 4;
    case DType::kBfloat16:
      return 2;
  }
  return 0;
}

const char* dtypeName(DType dtype) {
  switch (dtype) {
    case DType::kFloat32:
      return "float32";
    case DType::kBfloat16:
      return "bfloat16";
    case DType::kInt32:
      return "int32";
  }
  return "?";
}

Tensor Tensor::zeros(std::vector<int64_t> shape, DType dtype, Ops* ops) {
  Tensor tensor;
  tensor.numel_ = countOf(shape);
  tensor.shape_ = std::move(shape);
  tensor.dtype_ = dtype;
  tensor.ops_ = ops;
  const size_t bytes = std::max<size_t>(tensor.bytes(), 1);
  if (ops == nullptr)
    tensor.storage_ =
        std::shared_ptr<void>(new std::byte[bytes](), [](void* p) { delete[] static_cast<std::byte*>(p); });
  else
    tensor.storage_ = std::shared_ptr<void>(ops->allocate(bytes), [ops](void* p) { ops->deallocate(p); });
  return tensor;
}

Tensor Tensor::view(const Tensor& base, size_t offset, std::vector<int64_t> shape) {
  Tensor tensor;
  tensor.numel_ = countOf(shape);
  if (offset + tensor.numel_ > base.numel_) {
    std::fprintf(stderr, "tensor: a view of %zu elements at %zu does not fit in %s\n", tensor.numel_, offset,
                 base.describe().c_str());
    std::abort();
  }
  tensor.shape_ = std::move(shape);
  tensor.dtype_ = base.dtype_;
  tensor.storage_ = base.storage_;
  tensor.ops_ = base.ops_;
  tensor.offsetBytes_ = base.offsetBytes_ + offset * dtypeBytes(base.dtype_);
  return tensor;
}

std::string Tensor::describe() const {
  std::string text = std::string(dtypeName(dtype_)) + "[";
  for (size_t i = 0; i < shape_.size(); ++i) text += (i ? ", " : "") + std::to_string(shape_[i]);
  return text + "]";
}

float* Tensor::f32() {
  if (dtype_ != DType::kFloat32) wrongType(*this, "float32");
  return static_cast<float*>(data());
}
const float* Tensor::f32() const {
  if (dtype_ != DType::kFloat32) wrongType(*this, "float32");
  return static_cast<const float*>(data());
}
int32_t* Tensor::i32() {
  if (dtype_ != DType::kInt32) wrongType(*this, "int32");
  return static_cast<int32_t*>(data());
}
const int32_t* Tensor::i32() const {
  if (dtype_ != DType::kInt32) wrongType(*this, "int32");
  return static_cast<const int32_t*>(data());
}

void Tensor::zero() {
  if (!storage_) return;
  if (ops_ != nullptr)
    ops_->zero(data(), bytes());
  else
    std::memset(data(), 0, bytes());
}

}  // namespace loom::parallel
