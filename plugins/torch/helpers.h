// loom_torch's helpers (loom_torch.cc describes the backend): its errors, the reductions torch asks for as loom
// runs them (a loom op, PREMUL_SUM's scaling, the bitwise ops' fold), and the checks and flattening of tensors.
// The torch headers every file of the backend uses are included here.
#pragma once

#include <pybind11/chrono.h>
#include <torch/extension.h>
#include <torch/version.h>

#include <torch/csrc/distributed/c10d/PrefixStore.hpp>
#include <torch/csrc/distributed/c10d/Store.hpp>
#include <torch/csrc/distributed/c10d/Types.hpp>
#if TORCH_VERSION_MAJOR >= 2
#include <torch/csrc/distributed/c10d/Backend.hpp>
#else
#include <torch/csrc/distributed/c10d/ProcessGroup.hpp>
#endif

#include <cstddef>
#include <string>
#include <vector>

#include "loom/loom.h"

namespace loom_torch {

// A lambda that copies what it uses, `this` included: [=] in C++17 (torch 1.13), [=, this] from C++20 (torch 2.x).
#if __cplusplus >= 202002L
#define COPY_ALL =, this
#else
#define COPY_ALL =
#endif

#if TORCH_VERSION_MAJOR >= 2
using Base = c10d::Backend;
#else
using Base = c10d::ProcessGroup;
#endif

[[noreturn]] void fail(const std::string& message);

void check(loomResult_t result, loomComm_t comm, const char* what);

// The tensor whose elements loom reduces: a complex tensor's real view, else the tensor itself.
at::Tensor reducible(const at::Tensor& tensor);

// How an operation reduces: a loom op (after scaling the input by `scale` for PREMUL_SUM), or a bitwise op folded
// here.
struct Reduction {
  loomRedOp_t op = loomSum;
  bool bitwise = false;
  c10d::ReduceOp::RedOpType bitwiseOp = c10d::ReduceOp::BAND;
  bool scaled = false;
  double scale = 1.0;
  at::Tensor scaleTensor;  // PREMUL_SUM's factor as a one-element tensor, when it came as one
};

// The reduction `op` asks for on `tensor` (its dtype checked against it), or an error naming what does not fit.
Reduction reductionOf(const c10d::ReduceOp& op, const at::Tensor& tensor, const char* what);

// loom's type for the elements of reducible(tensor) under `r`, or an error naming the type.
loomDataType_t reduceTypeOf(const at::Tensor& tensor, const Reduction& r, const char* what);

// The input of a reduction of `tensor` by `r`: the tensor, or a copy scaled by PREMUL_SUM's factor.
at::Tensor scaledInput(const at::Tensor& tensor, const Reduction& r);

// Folds the rows of `stacked` ([ranks, n]) by a bitwise op into a tensor of n.
at::Tensor fold(const at::Tensor& stacked, c10d::ReduceOp::RedOpType op);

// A tensor's bytes, for the operations that move data without reducing it (any dtype).
size_t bytesOf(const at::Tensor& tensor);

// Checks a tensor loom can use, in place or through host memory: on the CPU or a CUDA device, dense and contiguous.
void checkTensor(const at::Tensor& tensor, const char* what);

void checkSingle(const std::vector<at::Tensor>& tensors, const char* what);

// All the tensors of a list into one contiguous buffer, and back.
at::Tensor flatten(const std::vector<at::Tensor>& tensors);
void unflatten(const at::Tensor& flat, const std::vector<at::Tensor>& tensors);

}  // namespace loom_torch
