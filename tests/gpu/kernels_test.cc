// The CUDA kernels (exec/cuda/kernels.h) on a device against the host kernels (exec/reduce.h): every type and
// operator, counts from 1 to past a million, vector and element paths (aligned and misaligned buffers), in
// place; avg's divide; copies of odd lengths and offsets; a flat plan walked on the device as on the host; the
// GPU executor's lanes running an AllReduce between kernels. NaNs compare by NaN-ness (a device conversion may
// return another NaN payload). Exits 77 (skipped) when there is no CUDA device.
#include "src/exec/cuda/kernels.h"

#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "algorithms/builders.h"
#include "algorithms/flat_plan.h"
#include "src/base/dtype.h"
#include "src/exec/reduce.h"
#include "tests/common/elements.h"
#include "transports/fifo.h"

namespace loom {
namespace {

constexpr loomDataType_t kTypes[] = {loomInt8,   loomUint8,   loomInt32,   loomUint32,  loomInt64,
                                     loomUint64, loomFloat16, loomFloat32, loomFloat64, loomBfloat16};
constexpr size_t kCounts[] = {1, 7, 1000, (1 << 20) + 3};

// A device buffer holding `bytes` of host data at `offset` bytes past an aligned allocation.
class DeviceBuffer {
 public:
  DeviceBuffer(size_t bytes, size_t offset) : offset_(offset) {
    EXPECT_EQ(cudaMalloc(&base_, bytes + offset + 16), cudaSuccess);
  }
  ~DeviceBuffer() { cudaFree(base_); }
  void* get() const { return static_cast<char*>(base_) + offset_; }
  void upload(const std::vector<unsigned char>& data) {
    EXPECT_EQ(cudaMemcpy(get(), data.data(), data.size(), cudaMemcpyHostToDevice), cudaSuccess);
  }
  std::vector<unsigned char> download(size_t bytes) const {
    std::vector<unsigned char> data(bytes);
    EXPECT_EQ(cudaMemcpy(data.data(), get(), bytes, cudaMemcpyDeviceToHost), cudaSuccess);
    return data;
  }

 private:
  void* base_ = nullptr;
  size_t offset_;
};

size_t mismatches(loomDataType_t type, const std::vector<unsigned char>& expected,
                  const std::vector<unsigned char>& got, size_t count) {
  size_t wrong = 0;
  for (size_t i = 0; i < count; ++i) wrong += !loomtest::sameElement(type, expected.data(), got.data(), i);
  return wrong;
}

TEST(CudaKernels, ReduceMatchesTheHost) {
  for (loomDataType_t type : kTypes) {
    for (loomRedOp_t op : {loomSum, loomProd, loomMax, loomMin}) {
      for (size_t count : kCounts) {
        for (size_t misalign : {size_t{0}, dtypeSize(type)}) {
          const size_t bytes = count * dtypeSize(type);
          auto a = loomtest::randomBytes(bytes, count + type);
          auto b = loomtest::randomBytes(bytes, count * 3 + op);
          loomtest::plantSpecials(type, a, b);
          std::vector<unsigned char> expected(bytes);
          reduceFunction(type, op)(expected.data(), a.data(), b.data(), count);
          DeviceBuffer dA(bytes, misalign), dB(bytes, 0), dOut(bytes, 0);
          dA.upload(a);
          dB.upload(b);
          ASSERT_EQ(device::enqueueReduce(dOut.get(), dA.get(), dB.get(), count, type, op, nullptr), loomSuccess);
          ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
          EXPECT_EQ(mismatches(type, expected, dOut.download(bytes), count), 0u)
              << dtypeName(type) << " " << opName(op) << " count " << count << " misaligned by " << misalign;
          // In place: b = a op b.
          ASSERT_EQ(device::enqueueReduce(dB.get(), dA.get(), dB.get(), count, type, op, nullptr), loomSuccess);
          ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
          EXPECT_EQ(mismatches(type, expected, dB.download(bytes), count), 0u)
              << dtypeName(type) << " " << opName(op) << " in place, count " << count;
        }
      }
    }
  }
}

TEST(CudaKernels, DivideMatchesTheHost) {
  for (loomDataType_t type : kTypes) {
    for (size_t count : kCounts) {
      const size_t bytes = count * dtypeSize(type);
      auto expected = loomtest::randomBytes(bytes, count + 17 * type);
      DeviceBuffer data(bytes, 0);
      data.upload(expected);
      divideInPlace(expected.data(), count, type, 6);
      ASSERT_EQ(device::enqueueDivide(data.get(), count, type, 6, nullptr), loomSuccess);
      ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
      EXPECT_EQ(mismatches(type, expected, data.download(bytes), count), 0u) << dtypeName(type) << " count " << count;
    }
  }
}

TEST(CudaKernels, CopyIsExact) {
  for (size_t bytes : {size_t{1}, size_t{15}, size_t{16}, size_t{4097}, size_t{(8 << 20) + 5}}) {
    for (size_t misalign : {size_t{0}, size_t{3}}) {
      const auto data = loomtest::randomBytes(bytes, bytes);
      DeviceBuffer src(bytes, misalign), dst(bytes, 0);
      src.upload(data);
      ASSERT_EQ(device::enqueueCopy(dst.get(), src.get(), bytes, nullptr), loomSuccess);
      ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
      EXPECT_EQ(dst.download(bytes), data) << bytes << " bytes, source misaligned by " << misalign;
    }
  }
}

// A flat plan copied to the device is walked there in the host executor's order (flat_plan_test checks the same
// walk on the host, for every algorithm).
TEST(CudaKernels, PlanWalkMatchesTheHost) {
  for (const char* algorithm : {"ring", "tree", "rabenseifner"}) {
    CollArgs args;
    args.collective = Collective::kAllReduce;
    args.nranks = 4;
    args.rank = 1;
    args.count = 100003;
    args.nChannels = 2;
    RankPlan plan;
    ASSERT_TRUE(buildPlan(args, algorithm, &plan)) << algorithm;
    FlatPlan flat = flatten(plan);
    auto toDevice = [](const auto& vector) {
      void* pointer = nullptr;
      size_t bytes = vector.size() * sizeof(vector[0]);
      EXPECT_EQ(cudaMalloc(&pointer, bytes + 1), cudaSuccess);
      EXPECT_EQ(cudaMemcpy(pointer, vector.data(), bytes, cudaMemcpyHostToDevice), cudaSuccess);
      return pointer;
    };
    FlatPlanView view = flat.view();
    view.lanes = static_cast<const FlatLane*>(toDevice(flat.lanes));
    view.steps = static_cast<const Step*>(toDevice(flat.steps));
    view.phaseStarts = static_cast<const uint32_t*>(toDevice(flat.phaseStarts));
    const size_t kCapacity = 1 << 16;
    uint32_t* visits = nullptr;
    unsigned long long* count = nullptr;
    ASSERT_EQ(cudaMalloc(&visits, 2 * kCapacity * sizeof(uint32_t)), cudaSuccess);
    ASSERT_EQ(cudaMalloc(&count, sizeof(*count)), cudaSuccess);
    for (uint32_t l = 0; l < view.laneCount; ++l) {
      for (size_t slice : {size_t{64}, size_t{4099}}) {
        ASSERT_EQ(device::enqueuePlanWalk(view, l, slice, visits, kCapacity, count, nullptr), loomSuccess);
        ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
        unsigned long long visited = 0;
        ASSERT_EQ(cudaMemcpy(&visited, count, sizeof(visited), cudaMemcpyDeviceToHost), cudaSuccess);
        ASSERT_LE(visited, kCapacity);
        std::vector<uint32_t> got(2 * visited);
        ASSERT_EQ(cudaMemcpy(got.data(), visits, got.size() * sizeof(uint32_t), cudaMemcpyDeviceToHost), cudaSuccess);
        std::vector<uint32_t> want;
        auto slicesOf = [slice](const Step& step) { return sliceCount(step.count(), slice); };
        LaneCursor cursor;
        for (cursor.start(plan.lanes[l], slicesOf); !cursor.done(); cursor.next(slicesOf)) {
          want.push_back(static_cast<uint32_t>(cursor.step()));
          want.push_back(static_cast<uint32_t>(cursor.round()));
        }
        EXPECT_EQ(got, want) << algorithm << " lane " << l << " slices of " << slice;
      }
    }
    cudaFree(visits);
    cudaFree(count);
    cudaFree(const_cast<FlatLane*>(view.lanes));
    cudaFree(const_cast<Step*>(view.steps));
    cudaFree(const_cast<uint32_t*>(view.phaseStarts));
  }
}

// A copy of `values` in device memory (freed by the caller).
template <class T>
T* onDevice(const std::vector<T>& values) {
  void* pointer = nullptr;
  EXPECT_EQ(cudaMalloc(&pointer, values.size() * sizeof(T) + 1), cudaSuccess);
  EXPECT_EQ(cudaMemcpy(pointer, values.data(), values.size() * sizeof(T), cudaMemcpyHostToDevice), cudaSuccess);
  return static_cast<T*>(pointer);
}

// The GPU executor's kernel: ranks as kernels on streams of their own, one CTA per lane, exchanging messages
// through FIFOs in device memory, against the reference (unit/lane_runner_test.cc runs the same core on host
// threads).
TEST(CudaKernels, LanesRunAnAllReduceAcrossStreams) {
  const FifoShape shape{4, 65536, 16448};
  const FifoWords words = fifoWords();
  for (const char* algorithm : {"ring", "tree"}) {
    for (int nranks : {2, 4}) {
      for (size_t count : {size_t{1000}, size_t{100003}}) {
        const std::string where =
            std::string(algorithm) + " ranks " + std::to_string(nranks) + " count " + std::to_string(count);
        std::vector<FlatPlan> plans(nranks);
        int channels = 0;
        for (int r = 0; r < nranks; ++r) {
          CollArgs args;
          args.collective = Collective::kAllReduce;
          args.nranks = nranks;
          args.rank = r;
          args.count = count;
          args.nChannels = 2;
          RankPlan plan;
          ASSERT_TRUE(buildPlan(args, algorithm, &plan)) << where;
          for (const Lane& lane : plan.lanes) channels = std::max(channels, lane.channel + 1);
          plans[r] = flatten(plan);
        }
        // Every FIFO, laid out on the host and copied to the device; the ends by rank, channel and peer.
        std::vector<void*> allocations;
        std::vector<unsigned char> image(fifoBytes(shape));
        fifoInit(image.data(), shape);
        std::vector<std::vector<PortableEnd>> recvEnds(nranks), sendEnds(nranks);
        for (int r = 0; r < nranks; ++r) {
          recvEnds[r].resize(channels * nranks);
          sendEnds[r].resize(channels * nranks);
        }
        for (int c = 0; c < channels; ++c)
          for (int from = 0; from < nranks; ++from)
            for (int to = 0; to < nranks; ++to) {
              if (from == to) continue;
              unsigned char* fifo = onDevice(image);
              allocations.push_back(fifo);
              PortableEnd end;
              end.fifo = fifo;
              end.depth = shape.depth;
              end.slotBytes = shape.slotBytes;
              end.llSlotBytes = shape.llSlotBytes;
              sendEnds[from][c * nranks + to] = end;
              recvEnds[to][c * nranks + from] = end;
            }
        std::vector<cudaStream_t> streams(nranks);
        std::vector<float*> outputs(nranks);
        uint32_t* statuses = onDevice(std::vector<uint32_t>(nranks, 0));
        for (int r = 0; r < nranks; ++r) {
          std::vector<float> input(plans[r].inputCount);
          for (size_t i = 0; i < input.size(); ++i)
            input[i] = static_cast<float>((r + 1) * 3 + static_cast<int>(i % 7));
          float* in = onDevice(input);
          outputs[r] = onDevice(std::vector<float>(plans[r].outputCount, -1.0f));
          float* scratch = onDevice(std::vector<float>(std::max<size_t>(plans[r].scratchCount, 1)));
          PortableEnd* recv = onDevice(recvEnds[r]);
          PortableEnd* send = onDevice(sendEnds[r]);
          FlatPlanView view = plans[r].view();
          view.lanes = onDevice(plans[r].lanes);
          view.steps = onDevice(plans[r].steps);
          view.phaseStarts = onDevice(plans[r].phaseStarts);
          for (const void* pointer :
               {static_cast<const void*>(in), static_cast<const void*>(scratch), static_cast<const void*>(recv),
                static_cast<const void*>(send), static_cast<const void*>(view.lanes),
                static_cast<const void*>(view.steps), static_cast<const void*>(view.phaseStarts)})
            allocations.push_back(const_cast<void*>(pointer));
          LaneCall call{reinterpret_cast<unsigned char*>(in),
                        reinterpret_cast<unsigned char*>(outputs[r]),
                        reinterpret_cast<unsigned char*>(scratch),
                        shape.slotBytes / sizeof(float),
                        fifo::llPayloadBytes(shape.llSlotBytes) / sizeof(float),
                        8192,
                        -1};
          ASSERT_EQ(cudaStreamCreateWithFlags(&streams[r], cudaStreamNonBlocking), cudaSuccess);
          ASSERT_EQ(
              device::enqueueLanes(view, call, words, recv, send, nranks, loomFloat32, loomSum, nullptr,
                                   uint64_t{20} * 1000 * 1000 * 1000, statuses + r, shape.llSlotBytes, streams[r]),
              loomSuccess)
              << where;
        }
        for (int r = 0; r < nranks; ++r) ASSERT_EQ(cudaStreamSynchronize(streams[r]), cudaSuccess) << where;
        std::vector<uint32_t> status(nranks);
        ASSERT_EQ(cudaMemcpy(status.data(), statuses, nranks * sizeof(uint32_t), cudaMemcpyDeviceToHost), cudaSuccess);
        for (int r = 0; r < nranks; ++r) {
          EXPECT_EQ(status[r], kLaneOk) << where << " rank " << r;
          std::vector<float> got(plans[r].outputCount);
          ASSERT_EQ(cudaMemcpy(got.data(), outputs[r], got.size() * sizeof(float), cudaMemcpyDeviceToHost),
                    cudaSuccess);
          size_t wrong = 0;
          for (size_t i = 0; i < got.size(); ++i) {
            float want = 0;
            for (int q = 0; q < nranks; ++q) want += static_cast<float>((q + 1) * 3 + static_cast<int>(i % 7));
            wrong += got[i] != want;
          }
          EXPECT_EQ(wrong, 0u) << where << " rank " << r;
          cudaStreamDestroy(streams[r]);
          cudaFree(outputs[r]);
        }
        cudaFree(statuses);
        for (void* pointer : allocations) cudaFree(pointer);
      }
    }
  }
}

// One-shot and two-shot AllReduce with the ranks as streams of one device, three calls in a row (both mailbox
// slots, growing flags), against the reference: the kernel layer over src/exec/peer_allreduce.h.
TEST(CudaKernels, PeerAllReduceRunsAcrossStreams) {
  const FifoWords words = fifoWords();
  for (bool twoShot : {false, true}) {
    for (int nranks : {2, 4, 8}) {
      for (size_t count : {size_t{1}, size_t{1000}, size_t{100003}}) {
        const std::string where = std::string(twoShot ? "two-shot" : "one-shot") + " ranks " + std::to_string(nranks) +
                                  " count " + std::to_string(count);
        const size_t slotBytes =
            ((twoShot ? 2 * peerChunkBytes(count, sizeof(float), nranks) : count * sizeof(float)) + 255) / 256 * 256;
        const FifoShape shape{2, slotBytes, 64};
        std::vector<unsigned char> image(fifoBytes(shape));
        fifoInit(image.data(), shape);
        std::vector<void*> allocations;
        std::vector<std::vector<unsigned char*>> mailbox(nranks, std::vector<unsigned char*>(nranks, nullptr));
        for (int to = 0; to < nranks; ++to)
          for (int from = 0; from < nranks; ++from)
            if (from != to) allocations.push_back(mailbox[to][from] = onDevice(image));
        std::vector<cudaStream_t> streams(nranks);
        std::vector<float*> inputs(nranks), outputs(nranks);
        uint32_t* statuses = onDevice(std::vector<uint32_t>(nranks, 0));
        for (int r = 0; r < nranks; ++r) {
          ASSERT_EQ(cudaStreamCreateWithFlags(&streams[r], cudaStreamNonBlocking), cudaSuccess);
          allocations.push_back(outputs[r] = onDevice(std::vector<float>(count, -1.0f)));
          allocations.push_back(inputs[r] = onDevice(std::vector<float>(count, 0.0f)));
        }
        uint64_t epoch = 1;
        for (int c = 0; c < 3; ++c) {
          for (int r = 0; r < nranks; ++r) {
            std::vector<float> input(count);
            for (size_t i = 0; i < count; ++i) input[i] = static_cast<float>((r + 1) * 3 + static_cast<int>(i % 7) + c);
            ASSERT_EQ(cudaMemcpy(inputs[r], input.data(), count * sizeof(float), cudaMemcpyHostToDevice), cudaSuccess);
          }
          for (int r = 0; r < nranks; ++r) {
            PeerCall call;
            call.rank = r;
            call.nranks = nranks;
            call.input = reinterpret_cast<const unsigned char*>(inputs[r]);
            call.output = reinterpret_cast<unsigned char*>(outputs[r]);
            call.count = count;
            for (int p = 0; p < nranks; ++p) {
              call.inbox[p] = mailbox[r][p];
              call.outbox[p] = mailbox[p][r];
            }
            call.slotBytes = slotBytes;
            call.words = words;
            call.parity = static_cast<uint32_t>(c % 2);
            call.epoch = epoch;
            const uint64_t timeoutNs = uint64_t{20} * 1000 * 1000 * 1000;
            ASSERT_EQ(
                twoShot
                    ? device::enqueueTwoShot(call, loomFloat32, loomSum, nullptr, timeoutNs, statuses + r, streams[r])
                    : device::enqueueOneShot(call, loomFloat32, loomSum, nullptr, timeoutNs, statuses + r, streams[r]),
                loomSuccess)
                << where;
          }
          epoch += twoShot ? 2 : 1;
          for (int r = 0; r < nranks; ++r) ASSERT_EQ(cudaStreamSynchronize(streams[r]), cudaSuccess) << where;
          std::vector<uint32_t> status(nranks);
          ASSERT_EQ(cudaMemcpy(status.data(), statuses, nranks * sizeof(uint32_t), cudaMemcpyDeviceToHost),
                    cudaSuccess);
          for (int r = 0; r < nranks; ++r) {
            EXPECT_EQ(status[r], kLaneOk) << where << " call " << c << " rank " << r;
            std::vector<float> got(count);
            ASSERT_EQ(cudaMemcpy(got.data(), outputs[r], count * sizeof(float), cudaMemcpyDeviceToHost), cudaSuccess);
            size_t wrong = 0;
            for (size_t i = 0; i < count; ++i) {
              float want = 0;
              for (int q = 0; q < nranks; ++q) want += static_cast<float>((q + 1) * 3 + static_cast<int>(i % 7) + c);
              wrong += got[i] != want;
            }
            EXPECT_EQ(wrong, 0u) << where << " call " << c << " rank " << r;
          }
        }
        for (int r = 0; r < nranks; ++r) cudaStreamDestroy(streams[r]);
        cudaFree(statuses);
        for (void* pointer : allocations) cudaFree(pointer);
      }
    }
  }
}

TEST(CudaKernels, BadArgumentsAreErrors) {
  EXPECT_EQ(device::enqueueReduce(nullptr, nullptr, nullptr, 4, loomNumTypes, loomSum, nullptr), loomInvalidArgument);
  EXPECT_EQ(device::enqueueReduce(nullptr, nullptr, nullptr, 4, loomFloat32, loomNumOps, nullptr), loomInvalidArgument);
}

}  // namespace
}  // namespace loom
