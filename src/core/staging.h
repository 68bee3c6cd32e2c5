// How a CUDA communicator's staged call (cuda_calls.h) lays its device buffers out in host memory: the bytes of
// each buffer the call touches, merged where buffers overlap (in place) so that the staged call sees the same
// overlap, with what must be copied in before the call and out after it. Plain host code, unit-tested in CI.
#pragma once

#include <cstddef>
#include <vector>

#include "src/core/enqueue.h"

namespace loom {

// One buffer of a call: the call reads it (an input), writes all of it (an output), or writes only parts of it
// (AllToAllv's receive buffer, whose gaps between blocks must come back unchanged).
struct BufferExtent {
  char* base;
  size_t bytes;
  bool read;
  bool written;
  bool partial;
  const char* name;  // "sendbuff" or "recvbuff", for messages
};

// Appends the buffers of `call` on `nranks` ranks with the bytes the collective touches in each (api.cc checked
// the buffers against the same sizes). Null buffers and buffers of no bytes are left out.
void extentsOf(const Call& call, int nranks, std::vector<BufferExtent>* extents);

// A range of device memory and its place in the staging memory.
struct StagedSpan {
  char* base;
  size_t bytes;
  size_t offset;  // in the staging memory, a multiple of kStagingAlign
  bool copyIn;    // holds an input, or an output the call writes only in parts
  bool copyOut;   // holds an output
};
constexpr size_t kStagingAlign = 256;

// The extents merged into disjoint spans, in address order, laid out one after another; *totalBytes receives the
// staging memory they need.
std::vector<StagedSpan> spansOf(std::vector<BufferExtent> extents, size_t* totalBytes);

// Where `pointer`, a buffer of the spans' calls, lies in staging memory that starts at `host`; null for null, and
// for a pointer in no span (a buffer of no bytes, which nothing reads or writes).
char* stagedPointer(const std::vector<StagedSpan>& spans, char* host, const void* pointer);

}  // namespace loom
