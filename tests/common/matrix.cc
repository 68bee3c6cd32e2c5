// Test matrix: inputs, naive references and checks (see matrix.h).
#include "tests/common/matrix.h"

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <type_traits>

#include "src/base/dtype.h"  // inline fp16/bf16 conversions only (header-only, nothing from the library)

namespace loomtest {
namespace {

struct HalfBits {
  uint16_t bits;
};
struct Bf16Bits {
  uint16_t bits;
};

// Calls fn with a value of the storage type of `type`.
template <typename Fn>
void withType(loomDataType_t type, Fn fn) {
  switch (type) {
    case loomInt8:
      return fn(int8_t{});
    case loomUint8:
      return fn(uint8_t{});
    case loomInt32:
      return fn(int32_t{});
    case loomUint32:
      return fn(uint32_t{});
    case loomInt64:
      return fn(int64_t{});
    case loomUint64:
      return fn(uint64_t{});
    case loomFloat16:
      return fn(HalfBits{});
    case loomFloat32:
      return fn(float{});
    case loomFloat64:
      return fn(double{});
    case loomBfloat16:
      return fn(Bf16Bits{});
    default:
      return;
  }
}

template <typename T>
T fromDouble(double v) {
  if constexpr (std::is_same_v<T, HalfBits>) {
    return {loom::floatToHalf(static_cast<float>(v))};
  } else if constexpr (std::is_same_v<T, Bf16Bits>) {
    return {loom::floatToBf16(static_cast<float>(v))};
  } else {
    return static_cast<T>(v);
  }
}

template <typename T>
constexpr bool kIsInteger = std::is_integral_v<T>;
template <typename T>
constexpr bool kIsSigned = !std::is_integral_v<T> || std::is_signed_v<T>;

// Input element i of `rank` for case c.
template <typename T>
double inputValue(const Case& c, int rank, size_t i) {
  long r = rank, x = static_cast<long>(i % 1000003);
  if (!reduces(c.coll)) return static_cast<double>((r * 37 + x * 11) % 97);
  switch (c.op) {
    case loomProd:  // one rank per element contributes 2 (or -2), the rest 1: products stay tiny
      return static_cast<size_t>(r) == i % c.nranks ? (kIsSigned<T> && i % 3 == 0 ? -2.0 : 2.0) : 1.0;
    case loomMax:
    case loomMin:
      return static_cast<double>((r * 5 + x * 3) % 11 - (kIsSigned<T> ? 5 : 0));
    default:
      return static_cast<double>((r * 3 + x) % 7 - (kIsSigned<T> ? 3 : 0));
  }
}

// op over all ranks of their element i, as the library must compute it.
template <typename T>
T reducedValue(const Case& c, size_t i) {
  double acc = inputValue<T>(c, 0, i);
  for (int r = 1; r < c.nranks; ++r) {
    double v = inputValue<T>(c, r, i);
    switch (c.op) {
      case loomProd:
        acc *= v;
        break;
      case loomMax:
        acc = std::max(acc, v);
        break;
      case loomMin:
        acc = std::min(acc, v);
        break;
      default:
        acc += v;
        break;
    }
  }
  if (c.op != loomAvg) return fromDouble<T>(acc);
  if constexpr (kIsInteger<T>) {
    return static_cast<T>(static_cast<long long>(acc) / c.nranks);  // C division truncates, as NCCL's does
  } else if constexpr (std::is_same_v<T, double>) {
    return acc / c.nranks;
  } else {
    return fromDouble<T>(static_cast<float>(acc) / static_cast<float>(c.nranks));  // fp32 divide, then round
  }
}

// Per-pair counts of the AllToAllv case: deterministic in (from, to), so both sides agree; some are zero.
size_t pairCount(const Case& c, int from, int to) { return c.count * ((from + 2 * to) % 3) / 2; }

struct Layout {
  size_t sendCount = 0, recvCount = 0;  // elements of each buffer this rank allocates
  bool sendInsideRecv = false;          // in place: send = recv + offset (else recv = send + offset)
  size_t inPlaceOffset = 0;
};

Layout layoutOf(const Case& c, int rank) {
  size_t n = c.nranks, k = c.count;
  bool root = rank == c.root;
  Layout l;
  switch (c.coll) {
    case Coll::AllReduce:
      l = {k, k, true, 0};
      break;
    case Coll::Broadcast:
      l = {root ? k : 0, k, true, 0};
      break;
    case Coll::Reduce:
      l = {k, root ? k : 0, true, 0};
      break;
    case Coll::AllGather:
      l = {k, n * k, true, rank * k};
      break;
    case Coll::ReduceScatter:
      l = {n * k, k, false, rank * k};
      break;
    case Coll::AllToAll:
      l = {n * k, n * k};
      break;
    case Coll::Gather:
      l = {k, root ? n * k : 0, true, rank * k};
      break;
    case Coll::Scatter:
      l = {root ? n * k : 0, k, false, rank * k};
      break;
    case Coll::SendRecv:
      l = {k, k};
      break;
    case Coll::AllToAllv:
      for (int p = 0; p < c.nranks; ++p) l.sendCount += pairCount(c, rank, p), l.recvCount += pairCount(c, p, rank);
      break;
  }
  return l;
}

// Element j of the input of `rank` as an index into that rank's input sequence (AllToAllv packs blocks in
// reverse peer order, so displacements are not the identity).
size_t vOffset(const Case& c, int rank, int peer, bool send) {
  size_t at = 0;
  for (int p = c.nranks - 1; p > peer; --p) at += send ? pairCount(c, rank, p) : pairCount(c, p, rank);
  return at;
}

template <typename T>
std::string check(const Case& c, int rank, const T* out, size_t count, std::vector<T>& want) {
  for (size_t i = 0; i < count; ++i) {
    if (std::memcmp(&out[i], &want[i], sizeof(T)) != 0) {
      uint64_t got = 0, expected = 0;
      std::memcpy(&got, &out[i], sizeof(T));
      std::memcpy(&expected, &want[i], sizeof(T));
      char text[96];
      std::snprintf(text, sizeof(text), " element %zu has bits 0x%llx, expected 0x%llx", i, (unsigned long long)got,
                    (unsigned long long)expected);
      return describe(c) + ": rank " + std::to_string(rank) + text;
    }
  }
  return "";
}

// A buffer of `count` elements from the chosen kind of memory, released (and deregistered) on destruction. With
// device memory, data() is a host mirror: toDevice() and toHost() copy it across, at() names the same element on
// the device.
template <typename T>
class Buffer {
 public:
  Buffer(size_t count, Memory memory, loomComm_t comm, const Device* device)
      : count_(std::max<size_t>(count, 1)), memory_(memory), comm_(comm), device_(device) {
    if (memory_ == Memory::kLoomAlloc) {
      void* ptr = nullptr;
      if (loomMemAlloc(&ptr, count_ * sizeof(T)) == loomSuccess) data_ = static_cast<T*>(ptr);
      return;
    }
    plain_.resize(count_);
    data_ = plain_.data();
    if (memory_ == Memory::kRegistered) loomCommRegister(comm_, data_, count_ * sizeof(T), &handle_);
    if (memory_ == Memory::kDevice) {
      onDevice_ = device_ != nullptr ? static_cast<T*>(device_->allocate(count_ * sizeof(T))) : nullptr;
      if (onDevice_ == nullptr) data_ = nullptr;
    }
  }
  ~Buffer() {
    if (memory_ == Memory::kLoomAlloc && data_) loomMemFree(data_);
    if (handle_) loomCommDeregister(comm_, handle_);
    if (onDevice_) device_->release(onDevice_);
  }
  T* data() { return data_; }
  // Where the call sees `element` (an element of data()).
  T* at(T* element) { return onDevice_ ? onDevice_ + (element - data_) : element; }
  bool toDevice() { return !onDevice_ || device_->copy(onDevice_, data_, count_ * sizeof(T)); }
  bool toHost() { return !onDevice_ || device_->copy(data_, onDevice_, count_ * sizeof(T)); }

 private:
  size_t count_;
  Memory memory_;
  loomComm_t comm_;
  const Device* device_;
  std::vector<T> plain_;
  T* data_ = nullptr;
  T* onDevice_ = nullptr;
  void* handle_ = nullptr;
};

template <typename T>
std::string runTyped(const Case& c, loomComm_t comm, int rank, Memory memoryKind, const Device* device) {
  const size_t n = c.nranks, k = c.count;
  Layout l = layoutOf(c, rank);
  bool rootOnly =
      c.coll == Coll::Broadcast || c.coll == Coll::Reduce || c.coll == Coll::Gather || c.coll == Coll::Scatter;
  bool inPlace = c.inPlace && hasInPlace(c.coll) && (!rootOnly || rank == c.root);
  // One allocation: both buffers apart (with a gap), or the bigger one holding the other when in place.
  Buffer<T> memory(inPlace ? std::max(l.sendCount, l.recvCount) : l.sendCount + l.recvCount + 1, memoryKind, comm,
                   device);
  if (memory.data() == nullptr) return describe(c) + ": cannot allocate the buffers";
  T* send = memory.data();
  T* recv = memory.data() + l.sendCount + 1;
  if (inPlace) {
    recv = l.sendInsideRecv ? memory.data() : memory.data() + l.inPlaceOffset;
    send = l.sendInsideRecv ? memory.data() + l.inPlaceOffset : memory.data();
  }
  std::vector<T> sentinel(1);
  std::memset(sentinel.data(), 0x5a, sizeof(T));
  if (!inPlace)
    for (size_t i = 0; i < l.recvCount; ++i) recv[i] = sentinel[0];
  // Fill the input (AllToAllv: block for peer p at its displacement, element j of the block = its index in a
  // virtual per-pair sequence so the receiver can predict it).
  if (c.coll == Coll::AllToAllv) {
    for (int p = 0; p < c.nranks; ++p)
      for (size_t j = 0; j < pairCount(c, rank, p); ++j)
        send[vOffset(c, rank, p, true) + j] = fromDouble<T>(inputValue<T>(c, rank, p * 1000 + j));
  } else {
    for (size_t i = 0; i < l.sendCount; ++i) send[i] = fromDouble<T>(inputValue<T>(c, rank, i));
  }
  if (!memory.toDevice()) return describe(c) + ": cannot copy the inputs to the device";
  T* hostRecv = recv;
  send = memory.at(send);
  recv = memory.at(recv);
  loomStream_t stream = memoryKind == Memory::kDevice ? device->stream : nullptr;

  loomResult_t result = loomSuccess;
  switch (c.coll) {
    case Coll::AllReduce:
      result = loomAllReduce(send, recv, k, c.type, c.op, comm, stream);
      break;
    case Coll::Broadcast:
      result = loomBroadcast(send, recv, k, c.type, c.root, comm, stream);
      break;
    case Coll::Reduce:
      result = loomReduce(send, recv, k, c.type, c.op, c.root, comm, stream);
      break;
    case Coll::AllGather:
      result = loomAllGather(send, recv, k, c.type, comm, stream);
      break;
    case Coll::ReduceScatter:
      result = loomReduceScatter(send, recv, k, c.type, c.op, comm, stream);
      break;
    case Coll::AllToAll:
      result = loomAllToAll(send, recv, k, c.type, comm, stream);
      break;
    case Coll::Gather:
      result = loomGather(send, recv, k, c.type, c.root, comm, stream);
      break;
    case Coll::Scatter:
      result = loomScatter(send, recv, k, c.type, c.root, comm, stream);
      break;
    case Coll::SendRecv:
      loomGroupStart();
      loomSend(send, k, c.type, (rank + 1) % c.nranks, comm, stream);
      loomRecv(recv, k, c.type, (rank + c.nranks - 1) % c.nranks, comm, stream);
      result = loomGroupEnd();
      break;
    case Coll::AllToAllv: {
      std::vector<size_t> sc(n), sd(n), rc(n), rd(n);
      for (int p = 0; p < c.nranks; ++p) {
        sc[p] = pairCount(c, rank, p), sd[p] = vOffset(c, rank, p, true);
        rc[p] = pairCount(c, p, rank), rd[p] = vOffset(c, rank, p, false);
      }
      result = loomAllToAllv(send, sc.data(), sd.data(), recv, rc.data(), rd.data(), c.type, comm, stream);
      break;
    }
  }
  if (result != loomSuccess)
    return describe(c) + ": rank " + std::to_string(rank) + " returned " + loomGetErrorString(result) + ": " +
           loomGetLastError(comm);
  if (memoryKind == Memory::kDevice && !(device->synchronize(stream) && memory.toHost()))
    return describe(c) + ": rank " + std::to_string(rank) + ": the stream failed or the results could not be copied";
  loomResult_t asyncError = loomSuccess;
  if (memoryKind == Memory::kDevice && (loomCommGetAsyncError(comm, &asyncError) != loomSuccess || asyncError))
    return describe(c) + ": rank " + std::to_string(rank) + " has the async error " + loomGetErrorString(asyncError) +
           ": " + loomGetLastError(comm);

  std::vector<T> want(l.recvCount);
  switch (c.coll) {
    case Coll::AllReduce:
    case Coll::Reduce:
      for (size_t i = 0; i < l.recvCount; ++i) want[i] = reducedValue<T>(c, i);
      break;
    case Coll::ReduceScatter:
      for (size_t i = 0; i < k; ++i) want[i] = reducedValue<T>(c, rank * k + i);
      break;
    case Coll::Broadcast:
      for (size_t i = 0; i < k; ++i) want[i] = fromDouble<T>(inputValue<T>(c, c.root, i));
      break;
    case Coll::Scatter:
      for (size_t i = 0; i < k; ++i) want[i] = fromDouble<T>(inputValue<T>(c, c.root, rank * k + i));
      break;
    case Coll::AllGather:
    case Coll::Gather:
      for (size_t i = 0; i < l.recvCount; ++i)
        want[i] = fromDouble<T>(inputValue<T>(c, static_cast<int>(i / k), i % k));
      break;
    case Coll::AllToAll:
      for (size_t i = 0; i < l.recvCount; ++i)
        want[i] = fromDouble<T>(inputValue<T>(c, static_cast<int>(i / k), rank * k + i % k));
      break;
    case Coll::SendRecv:
      for (size_t i = 0; i < k; ++i) want[i] = fromDouble<T>(inputValue<T>(c, (rank + c.nranks - 1) % c.nranks, i));
      break;
    case Coll::AllToAllv:
      for (int p = 0; p < c.nranks; ++p)
        for (size_t j = 0; j < pairCount(c, p, rank); ++j)
          want[vOffset(c, rank, p, false) + j] = fromDouble<T>(inputValue<T>(c, p, rank * 1000 + j));
      break;
  }
  return check(c, rank, hostRecv, l.recvCount, want);
}

}  // namespace

const char* collName(Coll coll) {
  static const char* kNames[] = {"AllReduce", "Broadcast", "Reduce", "AllGather", "ReduceScatter",
                                 "AllToAll",  "AllToAllv", "Gather", "Scatter",   "SendRecv"};
  return kNames[static_cast<int>(coll)];
}

bool reduces(Coll coll) { return coll == Coll::AllReduce || coll == Coll::Reduce || coll == Coll::ReduceScatter; }

bool hasInPlace(Coll coll) { return coll != Coll::AllToAll && coll != Coll::AllToAllv && coll != Coll::SendRecv; }

std::string describe(const Case& c) {
  static const char* kTypes[] = {"int8",   "uint8", "int32", "uint32", "int64",
                                 "uint64", "half",  "float", "double", "bfloat16"};
  static const char* kOps[] = {"sum", "prod", "max", "min", "avg"};
  return std::string(collName(c.coll)) + " " + kTypes[c.type] + (reduces(c.coll) ? std::string(" ") + kOps[c.op] : "") +
         " count " + std::to_string(c.count) + " ranks " + std::to_string(c.nranks) + " root " +
         std::to_string(c.root) + (c.inPlace ? " in place" : " out of place");
}

std::vector<Case> matrix(int nranks, const std::vector<size_t>& counts) {
  std::vector<Case> cases;
  const Coll kColls[] = {Coll::AllReduce, Coll::Broadcast, Coll::Reduce, Coll::AllGather, Coll::ReduceScatter,
                         Coll::AllToAll,  Coll::AllToAllv, Coll::Gather, Coll::Scatter,   Coll::SendRecv};
  for (size_t count : counts) {
    int root = static_cast<int>(count % nranks);
    for (Coll coll : kColls)
      for (int type = 0; type < loomNumTypes; ++type)
        for (int op = 0; op < (reduces(coll) ? loomNumOps : 1); ++op)
          for (bool inPlace : {false, true}) {
            if (inPlace && !hasInPlace(coll)) continue;
            cases.push_back(
                {coll, static_cast<loomDataType_t>(type), static_cast<loomRedOp_t>(op), count, nranks, root, inPlace});
          }
  }
  return cases;
}

std::string runCase(const Case& c, loomComm_t comm, int rank, Memory memory, const Device* device) {
  if (memory == Memory::kDevice && device == nullptr) return describe(c) + ": device memory asked for, no Device";
  std::string error = "unknown datatype";
  withType(c.type, [&](auto value) { error = runTyped<decltype(value)>(c, comm, rank, memory, device); });
  return error;
}

}  // namespace loomtest
