// loom_torch: loom as a torch.distributed backend. `import loom_torch` registers the backend "loom"
// (torch.distributed.Backend.register_backend), so that init_process_group(backend="loom") and new_group(...,
// backend="loom") run their collectives over a loom communicator.
//
// A process group joins a loom communicator through the group's store: its rank 0 draws a unique id and sets it
// under a key of the group's prefix, the others read it. The group's timeout is the communicator's deadline, so a
// dead peer becomes an error on every survivor within it. Collectives run on a worker thread of the group, one at a
// time in the order they were called (the order every rank calls them), each a blocking loom call (the coalesced
// forms: one loom group of calls); the Work they return completes, with its future, when the call returns.
// Point-to-point messages go over a two-rank communicator per peer and direction (made on first use, its id passed
// through the store), each with a worker thread of its own, so that a send waiting for its receiver never holds up
// a receive from that peer. A message is its size, then its bytes: a receive checks the size, and a receive from
// any source listens on every peer's link and takes the first message to come (see take()). Tags are accepted but
// not used: between two ranks, messages match in the order they were sent.
//
// One source for torch 1.13 (the ProcessGroup base) and torch 2.x (the Backend base, by TORCH_VERSION_MAJOR).
// Tensors dense and contiguous, on the CPU or a CUDA device: a CUDA tensor goes through host memory (Staging: copied
// to the host when the call is made, after what its stream has queued so far; its result copied back, and the copy
// waited for, before the Work completes). Operations that move data take every dtype (as bytes); reductions take
// the types loom reduces (float, double, half, bfloat16, int8, uint8, int32, int64, and uint32 and uint64 on 2.x),
// complex tensors through their real view (SUM, AVG, PREMUL_SUM), bool as bytes (MIN and PRODUCT are AND, MAX and
// SUM are OR). PREMUL_SUM scales the input by its factor, then sums. The bitwise ops (BAND, BOR, BXOR, on integer
// and bool tensors) have no loom kernel: the inputs are gathered (all-gather, gather or all-to-all) and folded here.
//
// The files: helpers.h (errors, reductions, tensor checks), work.h (Staging, LoomWork, Worker), store.h (joining
// communicators through the store), process_group.h (ProcessGroupLoom; its collectives in collectives.cc, its
// messages in p2p.cc, its set-up and shutdown in process_group.cc); here, the module that registers the backend.
#include "plugins/torch/process_group.h"
#include "plugins/torch/store.h"

#include <chrono>
#include <string>
#include <vector>

namespace loom_torch {

c10::intrusive_ptr<Base> create(const c10::intrusive_ptr<c10d::Store>& store, int rank, int size,
                                const std::chrono::duration<float>& timeout) {
  const auto milliseconds = std::chrono::duration_cast<std::chrono::milliseconds>(timeout);
  return c10::make_intrusive<ProcessGroupLoom>(store, rank, size, milliseconds);
}

}  // namespace loom_torch

namespace loom_torch {
namespace {

// The torch this module was compiled against, "major.minor".
const std::string kBuiltFor = std::to_string(TORCH_VERSION_MAJOR) + "." + std::to_string(TORCH_VERSION_MINOR);

// torch.distributed, or an ImportError that says which torch this build needs and what this Python has, in place
// of pybind11's bare "initialization failed". The installed torch's version is read from its metadata first: a
// torch of another version must not be imported into a process holding this build's libtorch.
void importTorch() {
  std::string installed;
  try {
    installed = py::str(py::module_::import("importlib.metadata").attr("version")("torch"));
  } catch (py::error_already_set&) {
    // No metadata (a torch on PYTHONPATH only, or none): the import below says which.
  }
  const std::string hint =
      " (PYTHONPATH=build/plugins/torch is the build for Debian's torch 1.13 and /usr/bin/python3, "
      "build/plugins/torch/torch2 the build for torch 2.x and /opt/loom-torch2/bin/python; docs/TORCH.md)";
  if (!installed.empty() && installed.rfind(kBuiltFor + ".", 0) != 0)
    throw py::import_error("loom_torch: this build is for torch " + kBuiltFor + ", but this Python has torch " +
                           installed + hint);
  try {
    py::module_::import("torch.distributed");
  } catch (py::error_already_set& error) {
    throw py::import_error("loom_torch: this build is for torch " + kBuiltFor +
                           ", which this Python cannot import: " + error.what() + hint);
  }
}

}  // namespace
}  // namespace loom_torch

PYBIND11_MODULE(loom_torch, module) {
  module.doc() = "loom as a torch.distributed backend: import it, then init_process_group(backend=\"loom\")";
  // torch's bindings of the base class, which the class below derives from in Python too.
  loom_torch::importTorch();
  py::class_<loom_torch::ProcessGroupLoom, loom_torch::Base, c10::intrusive_ptr<loom_torch::ProcessGroupLoom>>(
      module, "ProcessGroupLoom")
      .def(py::init(
               [](const c10::intrusive_ptr<c10d::Store>& store, int rank, int size, std::chrono::milliseconds timeout) {
                 return c10::make_intrusive<loom_torch::ProcessGroupLoom>(store, rank, size, timeout);
               }),
           py::call_guard<py::gil_scoped_release>());
  module.def(
      "set_deterministic", [](bool on) { loom_torch::setDeterministic(on ? 1 : 0); }, py::arg("on") = true,
      "Groups made after this call reduce in rank order, the same bits whatever loom's choice of algorithm, "
      "channels or protocol (loom's LOOM_DETERMINISTIC; docs/RELIABILITY.md). Every rank must call it alike.");
  module.def(
      "deterministic", []() -> py::object {
        const int value = loom_torch::deterministicOption();
        if (value == LOOM_CONFIG_UNDEF_INT) return py::none();
        return py::bool_(value == 1);
      },
      "True or False as set_deterministic last set it; None when it was never called (LOOM_DETERMINISTIC decides).");
  module.def("_create", &loom_torch::create, py::call_guard<py::gil_scoped_release>(),
             "The backend's constructor for torch.distributed: (store, rank, size, timeout).");
  py::object backend = py::module_::import("torch.distributed").attr("Backend");
#if TORCH_VERSION_MAJOR >= 2
  backend.attr("register_backend")("loom", module.attr("_create"),
                                   py::arg("devices") = std::vector<std::string>{"cpu", "cuda"});
#else
  backend.attr("register_backend")("loom", module.attr("_create"));
#endif
}
