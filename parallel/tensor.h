// The parallel layer's tensor: a shape, an element type and storage on a device. No autograd: the model's forward
// and backward functions say what they read and write (parallel/model). Storage is shared, so a tensor is cheap
// to copy and a view of a flat buffer (a parameter inside a bucket, a shard) is a tensor too. Storage is host memory,
// or the memory of an Ops (parallel/kernels/ops.h): a CUDA device's when the model runs there.
#pragma once

#include <cstddef>
#include <cstdint>
#include <initializer_list>
#include <memory>
#include <string>
#include <vector>

namespace loom::parallel {

class Ops;

enum class DType : uint8_t { kFloat32, kBfloat16, kInt32 };

size_t dtypeBytes(DType dtype);
const char* dtypeName(DType dtype);

class Tensor {
 public:
  Tensor() = default;
  // Fresh storage for `shape`, zeroed: host memory, or `ops`' memory when given.
  static Tensor zeros(std::vector<int64_t> shape, DType dtype = DType::kFloat32, Ops* ops = nullptr);
  // `count` elements of `base` from element `offset` on, as `shape` (which must hold count elements); shares
  // base's storage.
  static Tensor view(const Tensor& base, size_t offset, std::vector<int64_t> shape);

  const std::vector<int64_t>& shape() const { return shape_; }
  int64_t dim(size_t index) const { return shape_.at(index); }
  size_t rank() const { return shape_.size(); }
  DType dtype() const { return dtype_; }
  size_t numel() const { return numel_; }
  size_t bytes() const { return numel_ * dtypeBytes(dtype_); }
  bool defined() const { return storage_ != nullptr; }
  std::string describe() const;  // "float32[4, 64, 128]"

  void* data() { return static_cast<std::byte*>(storage_.get()) + offsetBytes_; }
  const void* data() const { return static_cast<const std::byte*>(storage_.get()) + offsetBytes_; }
  // Where the storage lives: null for host memory.
  Ops* ops() const { return ops_; }
  // The elements as a type; aborts with a message when the tensor's dtype is another.
  float* f32();
  const float* f32() const;
  int32_t* i32();
  const int32_t* i32() const;

  void zero();

 private:
  std::shared_ptr<void> storage_;
  Ops* ops_ = nullptr;
  size_t offsetBytes_ = 0;
  std::vector<int64_t> shape_;
  size_t numel_ = 0;
  DType dtype_ = DType::kFloat32;
};

}  // namespace loom::parallel
