// What the perf harness needs of CUDA for -D cuda: devices, device buffers, streams and copies. Built with CUDA
// (LOOM_PERF_CUDA); elsewhere every function reports that the build has none. Only the harness includes this:
// the perf programs themselves stay device-neutral.
#pragma once

#include <cstddef>
#include <string>

namespace perf::cuda {

// Whether -D cuda can run here; otherwise *why says what is missing (no CUDA in the build, or no device).
bool available(std::string* why);
int deviceCount();
// Makes `device` current on the calling thread; its name and PCI bus id for the table's header.
bool select(int device, std::string* name, std::string* busId);
// Bytes of device memory free on the current device.
size_t freeBytes();
void* allocate(size_t bytes);  // null on failure
void release(void* pointer);
bool zero(void* pointer, size_t bytes);
// Either direction, on `stream` (a cudaStream_t; null: the default stream), so that it is ordered with the calls
// there; returns when done.
bool copy(void* dst, const void* src, size_t bytes, void* stream);
void* createStream();  // a cudaStream_t, or null on failure
bool synchronize(void* stream);
void destroyStream(void* stream);
// The last CUDA error's text ("" when none), for messages.
std::string lastError();

}  // namespace perf::cuda
