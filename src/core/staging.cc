// The layout of a CUDA communicator's staged calls (staging.h).
#include "src/core/staging.h"

#include <algorithm>

#include "src/base/dtype.h"

namespace loom {
namespace {

void addExtent(std::vector<BufferExtent>* extents, const void* base, size_t bytes, bool input, bool partial = false) {
  if (base == nullptr || bytes == 0) return;
  extents->push_back(BufferExtent{static_cast<char*>(const_cast<void*>(base)), bytes, input, !input, partial,
                                  input ? "sendbuff" : "recvbuff"});
}

}  // namespace

void extentsOf(const Call& call, int nranks, std::vector<BufferExtent>* extents) {
  const size_t e = dtypeSize(call.datatype), k = call.count * e, all = k * nranks;
  const void* in = call.inputs.empty() ? nullptr : call.inputs[0];
  const void* out = call.outputs.empty() ? nullptr : call.outputs[0];
  switch (call.collective) {
    case Collective::kAllReduce:
    case Collective::kBroadcast:
    case Collective::kReduce:
      addExtent(extents, in, k, true);
      addExtent(extents, out, k, false);
      break;
    case Collective::kAllGather:
    case Collective::kGather:
      addExtent(extents, in, k, true);
      addExtent(extents, out, all, false);
      break;
    case Collective::kReduceScatter:
    case Collective::kScatter:
      addExtent(extents, in, all, true);
      addExtent(extents, out, k, false);
      break;
    case Collective::kAllToAll:
      addExtent(extents, in, all, true);
      addExtent(extents, out, all, false);
      break;
    case Collective::kAllToAllv: {
      size_t sendEnd = 0, recvEnd = 0;
      for (int p = 0; p < nranks; ++p) {
        if (call.sendCounts[p]) sendEnd = std::max(sendEnd, call.sendDispls[p] + call.sendCounts[p]);
        if (call.recvCounts[p]) recvEnd = std::max(recvEnd, call.recvDispls[p] + call.recvCounts[p]);
      }
      addExtent(extents, in, sendEnd * e, true);
      addExtent(extents, out, recvEnd * e, false, true);
      break;
    }
    case Collective::kSendRecv:
      for (size_t i = 0; i < call.p2p.size(); ++i)
        addExtent(extents, call.p2p[i].isSend ? call.inputs[i] : call.outputs[i], call.p2p[i].count * e,
                  call.p2p[i].isSend);
      break;
    case Collective::kBarrier:
      break;
  }
}

std::vector<StagedSpan> spansOf(std::vector<BufferExtent> extents, size_t* totalBytes) {
  std::sort(extents.begin(), extents.end(),
            [](const BufferExtent& a, const BufferExtent& b) { return a.base < b.base; });
  std::vector<StagedSpan> spans;
  for (const BufferExtent& x : extents) {
    if (!spans.empty() && x.base < spans.back().base + spans.back().bytes) {
      StagedSpan& last = spans.back();
      last.bytes = std::max<size_t>(last.bytes, x.base + x.bytes - last.base);
      last.copyIn |= x.read || x.partial;
      last.copyOut |= x.written;
      continue;
    }
    spans.push_back(StagedSpan{x.base, x.bytes, 0, x.read || x.partial, x.written});
  }
  size_t offset = 0;
  for (StagedSpan& span : spans) {
    span.offset = offset;
    offset += (span.bytes + kStagingAlign - 1) / kStagingAlign * kStagingAlign;
  }
  *totalBytes = offset;
  return spans;
}

char* stagedPointer(const std::vector<StagedSpan>& spans, char* host, const void* pointer) {
  if (pointer == nullptr) return nullptr;
  auto* p = static_cast<const char*>(pointer);
  for (const StagedSpan& span : spans)
    if (p >= span.base && p < span.base + span.bytes) return host + span.offset + (p - span.base);
  return nullptr;
}

}  // namespace loom
