// loom_torch's helpers (helpers.h): errors, reductions, and the checks and flattening of tensors.
#include "plugins/torch/helpers.h"

#include <cstdint>
#include <stdexcept>
#include <string>
#include <vector>

namespace loom_torch {

[[noreturn]] void fail(const std::string& message) { throw std::runtime_error("loom: " + message); }

void check(loomResult_t result, loomComm_t comm, const char* what) {
  if (result == loomSuccess) return;
  fail(std::string(what) + " failed: " + loomGetErrorString(result) + ": " + loomGetLastError(comm));
}

at::Tensor reducible(const at::Tensor& tensor) { return tensor.is_complex() ? at::view_as_real(tensor) : tensor; }

std::string opName(c10d::ReduceOp::RedOpType op) {
  static const char* const names[] = {"SUM", "AVG", "PRODUCT", "MIN", "MAX", "BAND", "BOR", "BXOR", "PREMUL_SUM"};
  const auto index = static_cast<size_t>(op);
  return index < sizeof(names) / sizeof(names[0]) ? names[index] : "reduce op " + std::to_string(index);
}

Reduction reductionOf(const c10d::ReduceOp& op, const at::Tensor& tensor, const char* what) {
  Reduction r;
  const at::ScalarType type = tensor.scalar_type();
  const bool isBool = type == at::kBool, isFloat = at::isFloatingType(type) || at::isComplexType(type);
  const std::string where = std::string(what) + ": " + opName(op.op_) + " on " + c10::toString(type) + " tensors";
  switch (op.op_) {
    case c10d::ReduceOp::SUM:
      r.op = isBool ? loomMax : loomSum;  // bool: or
      break;
    case c10d::ReduceOp::AVG:
      if (isBool) fail(where + " is not defined");
      r.op = loomAvg;
      break;
    case c10d::ReduceOp::PRODUCT:
      r.op = isBool ? loomMin : loomProd;  // bool: and
      break;
    case c10d::ReduceOp::MIN:
      r.op = loomMin;
      break;
    case c10d::ReduceOp::MAX:
      r.op = loomMax;
      break;
    case c10d::ReduceOp::BAND:
    case c10d::ReduceOp::BOR:
    case c10d::ReduceOp::BXOR:
      if (isFloat) fail(where + ": bitwise ops take integer and bool tensors");
      r.bitwise = true;
      r.bitwiseOp = op.op_;
      break;
    case c10d::ReduceOp::PREMUL_SUM: {
      if (!isFloat) fail(where + ": PREMUL_SUM takes floating-point tensors");
      const auto* factor = dynamic_cast<const c10d::NCCLPreMulSumSupplement*>(op.supplement_.get());
      if (factor == nullptr) fail(where + " without its factor (make it with _make_nccl_premul_sum)");
      r.op = loomSum;
      r.scaled = true;
#if TORCH_VERSION_MAJOR >= 2
      if (factor->tensor_factor.defined()) r.scaleTensor = factor->tensor_factor;
#else
      if (!factor->tensor_factors.empty()) r.scaleTensor = factor->tensor_factors[0];
#endif
      if (r.scaleTensor.defined()) {
        if (r.scaleTensor.numel() != 1) fail(where + ": its factor must be one element");
        r.scaleTensor = r.scaleTensor.to(at::kCPU);
      } else {
        r.scale = factor->double_factor;
      }
      break;
    }
    default:
      fail(where + " is not supported");
  }
  if (at::isComplexType(type) && (r.op != loomSum && r.op != loomAvg))
    fail(where + ": complex tensors reduce by SUM, AVG and PREMUL_SUM only");
  return r;
}

loomDataType_t reduceTypeOf(const at::Tensor& tensor, const Reduction& r, const char* what) {
  switch (reducible(tensor).scalar_type()) {
    case at::kFloat:
      return loomFloat32;
    case at::kDouble:
      return loomFloat64;
    case at::kHalf:
      return loomFloat16;
    case at::kBFloat16:
      return loomBfloat16;
    case at::kChar:
      return loomInt8;
    case at::kByte:
    case at::kBool:
      return loomUint8;
    case at::kInt:
      return loomInt32;
    case at::kLong:
      return loomInt64;
#if TORCH_VERSION_MAJOR >= 2
    case at::kUInt32:
      return loomUint32;
    case at::kUInt64:
      return loomUint64;
#endif
    default:
      if (r.bitwise) return loomUint8;  // folded here: moved as bytes
      fail(std::string(what) + ": " + c10::toString(tensor.scalar_type()) +
           " tensors cannot be reduced (they can be moved: broadcast, all-gather, gather, scatter, all-to-all, send)");
  }
}

at::Tensor scaledInput(const at::Tensor& tensor, const Reduction& r) {
  if (!r.scaled) return tensor;
  return r.scaleTensor.defined() ? tensor * r.scaleTensor.to(tensor.scalar_type()) : tensor * r.scale;
}

at::Tensor fold(const at::Tensor& stacked, c10d::ReduceOp::RedOpType op) {
  at::Tensor acc = stacked[0].clone();
  for (int64_t row = 1; row < stacked.size(0); ++row) {
    if (op == c10d::ReduceOp::BAND)
      acc.bitwise_and_(stacked[row]);
    else if (op == c10d::ReduceOp::BOR)
      acc.bitwise_or_(stacked[row]);
    else
      acc.bitwise_xor_(stacked[row]);
  }
  return acc;
}

size_t bytesOf(const at::Tensor& tensor) { return static_cast<size_t>(tensor.numel()) * tensor.element_size(); }

void checkTensor(const at::Tensor& tensor, const char* what) {
  if (!tensor.device().is_cpu() && !tensor.device().is_cuda())
    fail(std::string(what) + ": tensors must be on the CPU or a CUDA device (this one is on " +
         tensor.device().str() + ")");
  if (tensor.is_sparse() || !tensor.is_contiguous()) fail(std::string(what) + ": tensors must be dense and contiguous");
}

void checkSingle(const std::vector<at::Tensor>& tensors, const char* what) {
  if (tensors.size() != 1)
    fail(std::string(what) + ": one tensor per call (got " + std::to_string(tensors.size()) + ")");
  checkTensor(tensors[0], what);
}

at::Tensor flatten(const std::vector<at::Tensor>& tensors) {
  std::vector<at::Tensor> flat;
  for (const at::Tensor& tensor : tensors) flat.push_back(tensor.reshape(-1));
  return at::cat(flat);
}
void unflatten(const at::Tensor& flat, const std::vector<at::Tensor>& tensors) {
  int64_t at = 0;
  for (const at::Tensor& tensor : tensors) {
    tensor.copy_(flat.narrow(0, at, tensor.numel()).view(tensor.sizes()));
    at += tensor.numel();
  }
}

}  // namespace loom_torch
