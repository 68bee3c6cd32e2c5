// A program written against the CUDA toolkit's nccl.h, linked with loom's libnccl.so.2, calling every function
// of NCCL's API and checking what it returns.
//
// With LOOM_NCCL_DEVICE=host the communicators are host ones and every call runs here, on host buffers. Without
// it they are CUDA ones: on a machine with a GPU the same checks run on device buffers (all ranks on one device
// when there is one), and on a machine without one the program checks that communicators and device memory are
// refused with CUDA's reason, and skips the rest.
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>
#include <gtest/gtest.h>
#include <nccl.h>

#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <set>
#include <string>
#include <thread>
#include <vector>

namespace {

bool hostMode() {
  const char* device = std::getenv("LOOM_NCCL_DEVICE");
  return device != nullptr && std::strcmp(device, "host") == 0;
}

int visibleDevices() {
  int count = 0;
  if (cudaGetDeviceCount(&count) != cudaSuccess) count = 0;
  (void)cudaGetLastError();
  return count;
}

// Communicators can be made here: host mode, or a GPU to make CUDA ones on.
bool canRun() { return hostMode() || visibleDevices() > 0; }

#define SKIP_WITHOUT_COMMUNICATORS() \
  if (!canRun()) GTEST_SKIP() << "CUDA communicators need a GPU (LOOM_NCCL_DEVICE=host runs these on the host)"

// One rank's buffer of n elements: host memory in host mode, device memory otherwise.
template <typename T>
class Buffer {
 public:
  explicit Buffer(size_t n, T fill = T()) : n_(n) {
    std::vector<T> init(n, fill);
    if (hostMode()) {
      host_ = init;
    } else {
      EXPECT_EQ(cudaMalloc(&device_, std::max<size_t>(n, 1) * sizeof(T)), cudaSuccess);
      upload(init);
    }
  }
  ~Buffer() {
    if (device_ != nullptr) cudaFree(device_);
  }
  Buffer(const Buffer&) = delete;
  Buffer& operator=(const Buffer&) = delete;
  T* get() { return hostMode() ? host_.data() : device_; }
  void upload(const std::vector<T>& values) {
    if (hostMode()) {
      host_ = values;
    } else {
      EXPECT_EQ(cudaMemcpy(device_, values.data(), values.size() * sizeof(T), cudaMemcpyHostToDevice), cudaSuccess);
    }
  }
  std::vector<T> download() const {
    if (hostMode()) return host_;
    std::vector<T> values(n_);
    EXPECT_EQ(cudaMemcpy(values.data(), device_, n_ * sizeof(T), cudaMemcpyDeviceToHost), cudaSuccess);
    return values;
  }

 private:
  size_t n_;
  std::vector<T> host_;
  T* device_ = nullptr;
};

// n communicators made by ncclCommInitAll in this thread, several per device where devices are fewer, with a
// stream each (none in host mode).
class World {
 public:
  explicit World(int n) : comms(n, nullptr), streams(n, nullptr) {
    std::vector<int> devices(n, 0);
    int visible = hostMode() ? 1 : visibleDevices();
    for (int r = 0; r < n; ++r) devices[r] = r % visible;
    EXPECT_EQ(ncclCommInitAll(comms.data(), n, devices.data()), ncclSuccess) << ncclGetLastError(nullptr);
    if (!hostMode()) {
      for (int r = 0; r < n; ++r) {
        cudaSetDevice(devices[r]);
        EXPECT_EQ(cudaStreamCreate(&streams[r]), cudaSuccess);
      }
    }
  }
  ~World() {
    for (int r = 0; r < size(); ++r) {
      if (comms[r] != nullptr) {
        EXPECT_EQ(ncclCommDestroy(comms[r]), ncclSuccess);
      }
      if (streams[r] != nullptr) cudaStreamDestroy(streams[r]);
    }
  }
  int size() const { return static_cast<int>(comms.size()); }
  // Calls each of calls(r) for every rank in one group, as one thread driving several communicators must, then
  // waits.
  template <typename... Calls>
  void run(const Calls&... calls) {
    auto expectSuccess = [](ncclResult_t result, int r) {
      EXPECT_EQ(result, ncclSuccess) << "rank " << r << ": " << ncclGetLastError(nullptr);
    };
    ASSERT_EQ(ncclGroupStart(), ncclSuccess);
    for (int r = 0; r < size(); ++r) (expectSuccess(calls(r), r), ...);
    ASSERT_EQ(ncclGroupEnd(), ncclSuccess) << ncclGetLastError(nullptr);
    for (cudaStream_t stream : streams)
      if (stream != nullptr) {
        EXPECT_EQ(cudaStreamSynchronize(stream), cudaSuccess);
      }
  }

  std::vector<ncclComm_t> comms;
  std::vector<cudaStream_t> streams;
};

template <typename T>
std::vector<std::unique_ptr<Buffer<T>>> buffers(int n, size_t count, T fill = T()) {
  std::vector<std::unique_ptr<Buffer<T>>> made;
  for (int r = 0; r < n; ++r) made.push_back(std::make_unique<Buffer<T>>(count, fill));
  return made;
}

// Rank r's input: small values, so that sums and products of up to 4 ranks are exact in every type.
double input(int r, size_t i) { return 1 + r + static_cast<double>(i % 3); }

template <typename T>
std::vector<T> inputs(int r, size_t count) {
  std::vector<T> values(count);
  for (size_t i = 0; i < count; ++i) values[i] = static_cast<T>(input(r, i));
  return values;
}

TEST(NcclApi, VersionAndErrorStrings) {
  int version = 0;
  ASSERT_EQ(ncclGetVersion(&version), ncclSuccess);
  EXPECT_EQ(version, NCCL_VERSION_CODE);
  EXPECT_EQ(ncclGetVersion(nullptr), ncclInvalidArgument);
  EXPECT_NE(std::string(ncclGetLastError(nullptr)).find("ncclGetVersion"), std::string::npos);
  std::set<std::string> strings;
  for (int code = ncclSuccess; code < ncclNumResults; ++code) {
    std::string text = ncclGetErrorString(static_cast<ncclResult_t>(code));
    EXPECT_FALSE(text.empty());
    strings.insert(text);
  }
  EXPECT_EQ(strings.size(), static_cast<size_t>(ncclNumResults));
  EXPECT_STREQ(ncclGetErrorString(static_cast<ncclResult_t>(99)), "unknown result code");
  ncclUniqueId a, b;
  ASSERT_EQ(ncclGetUniqueId(&a), ncclSuccess);
  ASSERT_EQ(ncclGetUniqueId(&b), ncclSuccess);
  EXPECT_NE(std::memcmp(&a, &b, sizeof(a)), 0);
  EXPECT_EQ(ncclGetUniqueId(nullptr), ncclInvalidArgument);
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wdeprecated-declarations"
  ncclResetDebugInit();
  pncclResetDebugInit();
#pragma GCC diagnostic pop
  int viaProfilingName = 0;
  ASSERT_EQ(pncclGetVersion(&viaProfilingName), ncclSuccess);
  EXPECT_EQ(viaProfilingName, version);
}

TEST(NcclApi, WithoutADeviceCudaCommunicatorsAreRefused) {
  if (hostMode() || visibleDevices() > 0) GTEST_SKIP() << "this machine can make CUDA communicators";
  ncclComm_t comms[2] = {nullptr, nullptr};
  int devices[2] = {0, 0};
  ncclResult_t result = ncclCommInitAll(comms, 2, devices);
  EXPECT_NE(result, ncclSuccess);
  EXPECT_EQ(comms[0], nullptr);
  EXPECT_NE(std::string(ncclGetLastError(nullptr)).find("CUDA"), std::string::npos) << ncclGetLastError(nullptr);
  void* memory = nullptr;
  EXPECT_EQ(ncclMemAlloc(&memory, 1 << 20), ncclUnhandledCudaError);
  EXPECT_NE(std::string(ncclGetLastError(nullptr)).find("cudaMalloc"), std::string::npos);
}

TEST(NcclApi, AllReduceEveryOperator) {
  SKIP_WITHOUT_COMMUNICATORS();
  World world(4);
  const size_t count = 1000;
  for (ncclRedOp_t op : {ncclSum, ncclProd, ncclMax, ncclMin, ncclAvg}) {
    auto send = buffers<float>(4, count);
    auto recv = buffers<float>(4, count);
    auto sendInt = buffers<int32_t>(4, count);
    auto recvInt = buffers<int32_t>(4, count);
    for (int r = 0; r < 4; ++r) {
      send[r]->upload(inputs<float>(r, count));
      sendInt[r]->upload(inputs<int32_t>(r, count));
    }
    world.run(
        [&](int r) {
          return ncclAllReduce(send[r]->get(), recv[r]->get(), count, ncclFloat32, op, world.comms[r],
                               world.streams[r]);
        },
        [&](int r) {
          return ncclAllReduce(sendInt[r]->get(), recvInt[r]->get(), count, ncclInt32, op, world.comms[r],
                               world.streams[r]);
        });
    for (int r = 0; r < 4; ++r) {
      std::vector<float> got = recv[r]->download();
      std::vector<int32_t> gotInt = recvInt[r]->download();
      for (size_t i = 0; i < count; ++i) {
        double sum = 0, prod = 1, max = -1e30, min = 1e30;
        for (int p = 0; p < 4; ++p) {
          double x = input(p, i);
          sum += x, prod *= x, max = std::max(max, x), min = std::min(min, x);
        }
        double want = op == ncclSum ? sum : op == ncclProd ? prod : op == ncclMax ? max : op == ncclMin ? min : sum / 4;
        int64_t wantInt = op == ncclAvg ? static_cast<int64_t>(sum) / 4 : static_cast<int64_t>(want);
        ASSERT_FLOAT_EQ(got[i], static_cast<float>(want)) << "op " << op << " rank " << r << " element " << i;
        ASSERT_EQ(gotInt[i], wantInt) << "op " << op << " rank " << r << " element " << i;
      }
    }
  }
  // In place, in half and bfloat16.
  auto half = buffers<__half>(4, count);
  auto bf16 = buffers<__nv_bfloat16>(4, count);
  for (int r = 0; r < 4; ++r) {
    std::vector<__half> h(count);
    std::vector<__nv_bfloat16> b(count);
    for (size_t i = 0; i < count; ++i) h[i] = __float2half(input(r, i)), b[i] = __float2bfloat16(input(r, i));
    half[r]->upload(h);
    bf16[r]->upload(b);
  }
  world.run(
      [&](int r) {
        return ncclAllReduce(half[r]->get(), half[r]->get(), count, ncclHalf, ncclSum, world.comms[r],
                             world.streams[r]);
      },
      [&](int r) {
        return ncclAllReduce(bf16[r]->get(), bf16[r]->get(), count, ncclBfloat16, ncclSum, world.comms[r],
                             world.streams[r]);
      });
  for (int r = 0; r < 4; ++r) {
    std::vector<__half> h = half[r]->download();
    std::vector<__nv_bfloat16> b = bf16[r]->download();
    for (size_t i = 0; i < count; ++i) {
      double sum = 0;
      for (int p = 0; p < 4; ++p) sum += input(p, i);
      ASSERT_EQ(__half2float(h[i]), sum);
      ASSERT_EQ(__bfloat162float(b[i]), sum);
    }
  }
}

// LOOM_DETERMINISTIC=1 in an NCCL program's environment: AllReduce and ReduceScatter give the sums in rank order,
// ((x0 + x1) + x2) + x3, bit for bit, under rules that allow the ring too. The control: without the switch, the
// ring forced, the same inputs (six decades, both signs) give other bits.
bool sumsInRankOrder(bool deterministic) {
  const int n = 4;
  const size_t count = 10007;
  setenv("LOOM_DETERMINISTIC", deterministic ? "1" : "0", 1);
  setenv("LOOM_ALGO", deterministic ? "allreduce:ring,direct;reducescatter:ring,direct" : "allreduce:ring;reducescatter:ring", 1);
  World world(n);
  unsetenv("LOOM_DETERMINISTIC");
  unsetenv("LOOM_ALGO");
  auto value = [](int r, size_t i) {
    const uint64_t x = (r + 1) * 2654435761u ^ (i + 1) * 40503u;
    return static_cast<float>(((x >> 7) & 1 ? -1.0 : 1.0) * (1.0 + (x % 9973) / 9973.0) *
                              std::pow(10.0, static_cast<int>((x >> 3) % 7) - 3));
  };
  auto send = buffers<float>(n, count * n);
  auto recv = buffers<float>(n, count * n);
  auto block = buffers<float>(n, count);
  for (int r = 0; r < n; ++r) {
    std::vector<float> mine(count * n);
    for (size_t i = 0; i < count * n; ++i) mine[i] = value(r, i);
    send[r]->upload(mine);
  }
  world.run([&](int r) {
    return ncclAllReduce(send[r]->get(), recv[r]->get(), count * n, ncclFloat32, ncclSum, world.comms[r],
                         world.streams[r]);
  });
  world.run([&](int r) {
    return ncclReduceScatter(send[r]->get(), block[r]->get(), count, ncclFloat32, ncclSum, world.comms[r],
                             world.streams[r]);
  });
  std::vector<float> want(count * n);
  for (size_t i = 0; i < count * n; ++i) {
    float sum = value(0, i);
    for (int r = 1; r < n; ++r) sum += value(r, i);
    want[i] = sum;
  }
  bool same = true;
  for (int r = 0; r < n; ++r) {
    std::vector<float> got = recv[r]->download(), mine = block[r]->download();
    same &= std::memcmp(got.data(), want.data(), want.size() * sizeof(float)) == 0;
    same &= std::memcmp(mine.data(), want.data() + r * count, count * sizeof(float)) == 0;
  }
  return same;
}

TEST(NcclApi, DeterministicFromTheEnvironment) {
  SKIP_WITHOUT_COMMUNICATORS();
  EXPECT_TRUE(sumsInRankOrder(true)) << "under LOOM_DETERMINISTIC=1 some sum is not in rank order";
  EXPECT_FALSE(sumsInRankOrder(false)) << "the ring's sums equal rank order's: the inputs cannot tell orders apart";
}

TEST(NcclApi, EveryOtherCollective) {
  SKIP_WITHOUT_COMMUNICATORS();
  const int n = 4;
  const size_t count = 777;
  World world(n);
  auto send = buffers<float>(n, count * n);
  auto recv = buffers<float>(n, count * n, -1.0f);
  auto reset = [&]() {
    for (int r = 0; r < n; ++r) {
      send[r]->upload(inputs<float>(r, count * n));
      recv[r]->upload(std::vector<float>(count * n, -1.0f));
    }
  };
  auto expectRecv = [&](int r, const std::function<float(size_t)>& want, size_t elements, const char* what) {
    std::vector<float> got = recv[r]->download();
    for (size_t i = 0; i < elements; ++i) ASSERT_EQ(got[i], want(i)) << what << " rank " << r << " element " << i;
  };
  // Broadcast from rank 1, and Bcast (in place) from rank 2.
  reset();
  world.run([&](int r) {
    return ncclBroadcast(send[r]->get(), recv[r]->get(), count, ncclFloat, 1, world.comms[r], world.streams[r]);
  });
  for (int r = 0; r < n; ++r)
    expectRecv(
        r, [](size_t i) { return input(1, i); }, count, "Broadcast");
  world.run([&](int r) { return ncclBcast(send[r]->get(), count, ncclFloat, 2, world.comms[r], world.streams[r]); });
  for (int r = 0; r < n; ++r) {
    std::vector<float> got = send[r]->download();
    for (size_t i = 0; i < count; ++i) ASSERT_EQ(got[i], input(2, i)) << "Bcast rank " << r;
  }
  // Reduce to rank 2.
  reset();
  world.run([&](int r) {
    return ncclReduce(send[r]->get(), recv[r]->get(), count, ncclFloat, ncclSum, 2, world.comms[r], world.streams[r]);
  });
  expectRecv(
      2, [](size_t i) { return input(0, i) + input(1, i) + input(2, i) + input(3, i); }, count, "Reduce");
  expectRecv(
      0, [](size_t) { return -1.0f; }, count, "Reduce (not root)");
  // AllGather out of place, then in place.
  reset();
  world.run([&](int r) {
    return ncclAllGather(send[r]->get(), recv[r]->get(), count, ncclFloat, world.comms[r], world.streams[r]);
  });
  for (int r = 0; r < n; ++r)
    expectRecv(
        r, [&](size_t i) { return input(static_cast<int>(i / count), i % count); }, count * n, "AllGather");
  reset();
  for (int r = 0; r < n; ++r) {
    std::vector<float> mine(count * n, -1.0f);
    for (size_t i = 0; i < count; ++i) mine[r * count + i] = input(r, i);
    recv[r]->upload(mine);
  }
  world.run([&](int r) {
    return ncclAllGather(recv[r]->get() + r * count, recv[r]->get(), count, ncclFloat, world.comms[r],
                         world.streams[r]);
  });
  for (int r = 0; r < n; ++r)
    expectRecv(
        r, [&](size_t i) { return input(static_cast<int>(i / count), i % count); }, count * n, "AllGather in place");
  // ReduceScatter.
  reset();
  world.run([&](int r) {
    return ncclReduceScatter(send[r]->get(), recv[r]->get(), count, ncclFloat, ncclMax, world.comms[r],
                             world.streams[r]);
  });
  for (int r = 0; r < n; ++r)
    expectRecv(
        r, [&](size_t i) { return input(3, r * count + i); }, count, "ReduceScatter");
  // AlltoAll: rank r's block p goes to rank p's block r.
  reset();
  world.run([&](int r) {
    return ncclAlltoAll(send[r]->get(), recv[r]->get(), count, ncclFloat, world.comms[r], world.streams[r]);
  });
  for (int r = 0; r < n; ++r)
    expectRecv(
        r, [&](size_t i) { return input(static_cast<int>(i / count), r * count + i % count); }, count * n, "AlltoAll");
  // Gather to rank 3, Scatter from rank 0.
  reset();
  world.run([&](int r) {
    return ncclGather(send[r]->get(), recv[r]->get(), count, ncclFloat, 3, world.comms[r], world.streams[r]);
  });
  expectRecv(
      3, [&](size_t i) { return input(static_cast<int>(i / count), i % count); }, count * n, "Gather");
  reset();
  world.run([&](int r) {
    return ncclScatter(send[r]->get(), recv[r]->get(), count, ncclFloat, 0, world.comms[r], world.streams[r]);
  });
  for (int r = 0; r < n; ++r)
    expectRecv(
        r, [&](size_t i) { return input(0, r * count + i); }, count, "Scatter");
  // Send/Recv around the ring, both in one group.
  reset();
  world.run(
      [&](int r) { return ncclSend(send[r]->get(), count, ncclFloat, (r + 1) % n, world.comms[r], world.streams[r]); },
      [&](int r) {
        return ncclRecv(recv[r]->get(), count, ncclFloat, (r + n - 1) % n, world.comms[r], world.streams[r]);
      });
  for (int r = 0; r < n; ++r)
    expectRecv(
        r, [&](size_t i) { return input((r + n - 1) % n, i); }, count, "Send/Recv");
}

// PreMulSum: each rank scales its input by its own scalar, then the values are summed.
template <typename T>
void checkPreMulSum(World& world, ncclDataType_t datatype, ncclScalarResidence_t residence) {
  const int n = world.size();
  const size_t count = 513;
  std::vector<ncclRedOp_t> ops(n);
  std::vector<std::unique_ptr<Buffer<T>>> scalars;
  for (int r = 0; r < n; ++r) {
    T scalar = static_cast<T>(static_cast<float>(r + 2));
    scalars.push_back(std::make_unique<Buffer<T>>(1, scalar));
    void* where = residence == ncclScalarDevice ? static_cast<void*>(scalars[r]->get()) : static_cast<void*>(&scalar);
    ASSERT_EQ(ncclRedOpCreatePreMulSum(&ops[r], where, datatype, residence, world.comms[r]), ncclSuccess)
        << ncclGetLastError(world.comms[r]);
    EXPECT_GE(static_cast<int>(ops[r]), static_cast<int>(ncclNumOps));
  }
  auto sum = [&](size_t i) {
    double total = 0;
    for (int p = 0; p < n; ++p) total += (p + 2) * input(p, i);
    return total;
  };
  auto send = buffers<T>(n, count * n);
  auto recv = buffers<T>(n, count * n);
  for (int r = 0; r < n; ++r) send[r]->upload(inputs<T>(r, count * n));
  world.run([&](int r) {
    return ncclAllReduce(send[r]->get(), recv[r]->get(), count, datatype, ops[r], world.comms[r], world.streams[r]);
  });
  for (int r = 0; r < n; ++r) {
    std::vector<T> got = recv[r]->download();
    for (size_t i = 0; i < count; ++i) ASSERT_EQ(static_cast<double>(got[i]), sum(i)) << "AllReduce rank " << r;
  }
  world.run([&](int r) {
    return ncclReduce(send[r]->get(), recv[r]->get(), count, datatype, ops[r], 1, world.comms[r], world.streams[r]);
  });
  std::vector<T> reduced = recv[1]->download();
  for (size_t i = 0; i < count; ++i) ASSERT_EQ(static_cast<double>(reduced[i]), sum(i)) << "Reduce";
  world.run([&](int r) {
    return ncclReduceScatter(send[r]->get(), recv[r]->get(), count, datatype, ops[r], world.comms[r], world.streams[r]);
  });
  for (int r = 0; r < n; ++r) {
    std::vector<T> got = recv[r]->download();
    for (size_t i = 0; i < count; ++i)
      ASSERT_EQ(static_cast<double>(got[i]), sum(r * count + i)) << "ReduceScatter rank " << r;
    // The inputs are untouched: scaling happens in the library's own buffers.
    std::vector<T> original = send[r]->download();
    for (size_t i = 0; i < count * n; ++i) ASSERT_EQ(static_cast<double>(original[i]), input(r, i));
  }
  for (int r = 0; r < n; ++r) EXPECT_EQ(ncclRedOpDestroy(ops[r], world.comms[r]), ncclSuccess);
}

TEST(NcclApi, PreMulSum) {
  SKIP_WITHOUT_COMMUNICATORS();
  World world(4);
  checkPreMulSum<float>(world, ncclFloat32, ncclScalarHostImmediate);
  checkPreMulSum<float>(world, ncclFloat32, ncclScalarDevice);
  checkPreMulSum<double>(world, ncclFloat64, ncclScalarDevice);
  checkPreMulSum<int32_t>(world, ncclInt32, ncclScalarHostImmediate);
  // An operator belongs to its datatype and lives until destroyed; built-in operators cannot be destroyed.
  float two = 2;
  ncclRedOp_t op;
  ASSERT_EQ(ncclRedOpCreatePreMulSum(&op, &two, ncclFloat32, ncclScalarHostImmediate, world.comms[0]), ncclSuccess);
  Buffer<int32_t> ints(8);
  EXPECT_EQ(ncclAllReduce(ints.get(), ints.get(), 8, ncclInt32, op, world.comms[0], world.streams[0]),
            ncclInvalidArgument);
  EXPECT_NE(std::string(ncclGetLastError(nullptr)).find("was created for ncclFloat32"), std::string::npos)
      << ncclGetLastError(nullptr);
  EXPECT_EQ(ncclRedOpDestroy(op, world.comms[0]), ncclSuccess);
  EXPECT_EQ(ncclRedOpDestroy(op, world.comms[0]), ncclInvalidArgument);
  EXPECT_EQ(ncclAllReduce(ints.get(), ints.get(), 8, ncclFloat32, op, world.comms[0], world.streams[0]),
            ncclInvalidArgument);
  EXPECT_EQ(ncclRedOpDestroy(ncclSum, world.comms[0]), ncclInvalidArgument);
  EXPECT_EQ(ncclRedOpCreatePreMulSum(&op, &two, ncclFloat8e4m3, ncclScalarHostImmediate, world.comms[0]),
            ncclInvalidUsage);
}

TEST(NcclApi, Fp8MovesAsBytesAndDoesNotReduce) {
  SKIP_WITHOUT_COMMUNICATORS();
  const int n = 2;
  const size_t count = 100;
  World world(n);
  auto send = buffers<uint8_t>(n, count);
  auto recv = buffers<uint8_t>(n, count * n);
  for (int r = 0; r < n; ++r) {
    std::vector<uint8_t> bytes(count);
    for (size_t i = 0; i < count; ++i) bytes[i] = static_cast<uint8_t>(r * 100 + i);
    send[r]->upload(bytes);
  }
  world.run([&](int r) {
    return ncclAllGather(send[r]->get(), recv[r]->get(), count, ncclFloat8e4m3, world.comms[r], world.streams[r]);
  });
  for (int r = 0; r < n; ++r) {
    std::vector<uint8_t> got = recv[r]->download();
    for (size_t i = 0; i < count * n; ++i) ASSERT_EQ(got[i], static_cast<uint8_t>((i / count) * 100 + i % count));
  }
  EXPECT_EQ(
      ncclAllReduce(send[0]->get(), recv[0]->get(), count, ncclFloat8e5m2, ncclSum, world.comms[0], world.streams[0]),
      ncclInvalidUsage);
  EXPECT_NE(std::string(ncclGetLastError(world.comms[0])).find("ncclFloat8e5m2 reductions are not supported"),
            std::string::npos)
      << ncclGetLastError(world.comms[0]);
}

// Each rank on a thread of its own, as in a program with one thread (or process) per GPU.
void onThreads(int n, const std::function<void(int)>& body) {
  std::vector<std::thread> threads;
  for (int r = 0; r < n; ++r)
    threads.emplace_back([&, r]() {
      if (!hostMode()) cudaSetDevice(r % visibleDevices());
      body(r);
    });
  for (std::thread& thread : threads) thread.join();
}

// One rank's AllReduce of n ranks' inputs, checked, with its own stream.
void allReduceOnThread(ncclComm_t comm, int r, int n, const char* what) {
  cudaStream_t stream = nullptr;
  if (!hostMode()) {
    ASSERT_EQ(cudaStreamCreate(&stream), cudaSuccess);
  }
  Buffer<float> buffer(64);
  buffer.upload(inputs<float>(r, 64));
  ASSERT_EQ(ncclAllReduce(buffer.get(), buffer.get(), 64, ncclFloat, ncclSum, comm, stream), ncclSuccess)
      << what << ": " << ncclGetLastError(comm);
  if (stream != nullptr) {
    ASSERT_EQ(cudaStreamSynchronize(stream), cudaSuccess);
  }
  std::vector<float> got = buffer.download();
  for (size_t i = 0; i < 64; ++i) {
    double sum = 0;
    for (int p = 0; p < n; ++p) sum += input(p, i);
    ASSERT_EQ(got[i], sum) << what << " rank " << r;
  }
  if (stream != nullptr) cudaStreamDestroy(stream);
}

TEST(NcclApi, InitRankOnThreadsThenSplitAndShrink) {
  SKIP_WITHOUT_COMMUNICATORS();
  const int n = 3;
  ncclUniqueId id;
  ASSERT_EQ(ncclGetUniqueId(&id), ncclSuccess);
  onThreads(n, [&](int r) {
    ncclComm_t comm = nullptr;
    ASSERT_EQ(ncclCommInitRank(&comm, n, id, r), ncclSuccess) << ncclGetLastError(nullptr);
    int count = 0, rank = -1, device = -2;
    EXPECT_EQ(ncclCommCount(comm, &count), ncclSuccess);
    EXPECT_EQ(ncclCommUserRank(comm, &rank), ncclSuccess);
    EXPECT_EQ(ncclCommCuDevice(comm, &device), ncclSuccess);
    EXPECT_EQ(count, n);
    EXPECT_EQ(rank, r);
    EXPECT_EQ(device, hostMode() ? -1 : r % visibleDevices());
    allReduceOnThread(comm, r, n, "InitRank");
    // Ranks 0 and 2 form a new communicator, in reverse order (key); rank 1 joins none.
    ncclComm_t half = reinterpret_cast<ncclComm_t>(&half);
    ASSERT_EQ(ncclCommSplit(comm, r == 1 ? NCCL_SPLIT_NOCOLOR : 7, -r, &half, nullptr), ncclSuccess)
        << ncclGetLastError(comm);
    if (r == 1) {
      EXPECT_EQ(half, nullptr);
    } else {
      int newRank = -1;
      EXPECT_EQ(ncclCommUserRank(half, &newRank), ncclSuccess);
      EXPECT_EQ(newRank, r == 0 ? 1 : 0);
      cudaStream_t stream = nullptr;
      Buffer<int32_t> value(1, r);
      EXPECT_EQ(ncclAllReduce(value.get(), value.get(), 1, ncclInt32, ncclSum, half, stream), ncclSuccess);
      if (!hostMode()) cudaDeviceSynchronize();
      EXPECT_EQ(value.download()[0], 2);
      EXPECT_EQ(ncclCommFinalize(half), ncclSuccess);
      EXPECT_EQ(ncclCommDestroy(half), ncclSuccess);
      // The same two by shrinking: rank 1 is excluded and does not take part.
      int excluded = 1;
      ncclComm_t shrunk = nullptr;
      ASSERT_EQ(ncclCommShrink(comm, &excluded, 1, &shrunk, nullptr, NCCL_SHRINK_DEFAULT), ncclSuccess)
          << ncclGetLastError(comm);
      EXPECT_EQ(ncclCommUserRank(shrunk, &newRank), ncclSuccess);
      EXPECT_EQ(newRank, r == 0 ? 0 : 1);
      Buffer<int32_t> other(1, r);
      EXPECT_EQ(ncclAllReduce(other.get(), other.get(), 1, ncclInt32, ncclSum, shrunk, stream), ncclSuccess);
      if (!hostMode()) cudaDeviceSynchronize();
      EXPECT_EQ(other.download()[0], 2);
      EXPECT_EQ(ncclCommDestroy(shrunk), ncclSuccess);
    }
    ncclResult_t state = ncclInternalError;
    EXPECT_EQ(ncclCommGetAsyncError(comm, &state), ncclSuccess);
    EXPECT_EQ(state, ncclSuccess);
    EXPECT_EQ(ncclCommFinalize(comm), ncclSuccess);
    EXPECT_EQ(ncclCommDestroy(comm), ncclSuccess);
  });
}

TEST(NcclApi, NonBlockingConfigAndScalableInit) {
  SKIP_WITHOUT_COMMUNICATORS();
  const int n = 2;
  ncclUniqueId id;
  ASSERT_EQ(ncclGetUniqueId(&id), ncclSuccess);
  onThreads(n, [&](int r) {
    ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
    config.blocking = 0;
    config.commName = "nccl-api-test";
    config.minCTAs = 4;  // a hint loom has no use for: accepted
    ncclComm_t comm = nullptr;
    ncclResult_t started = ncclCommInitRankConfig(&comm, n, id, r, &config);
    ASSERT_TRUE(started == ncclInProgress || started == ncclSuccess) << ncclGetErrorString(started);
    ncclResult_t state = ncclInProgress;
    auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(60);
    while (state == ncclInProgress && std::chrono::steady_clock::now() < deadline) {
      ASSERT_EQ(ncclCommGetAsyncError(comm, &state), ncclSuccess);
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
    ASSERT_EQ(state, ncclSuccess) << ncclGetLastError(comm);
    allReduceOnThread(comm, r, n, "non-blocking init");
    EXPECT_EQ(ncclCommDestroy(comm), ncclSuccess);
  });
  ASSERT_EQ(ncclGetUniqueId(&id), ncclSuccess);
  onThreads(n, [&](int r) {
    ncclComm_t comm = nullptr;
    ASSERT_EQ(ncclCommInitRankScalable(&comm, n, r, 1, &id, nullptr), ncclSuccess) << ncclGetLastError(nullptr);
    allReduceOnThread(comm, r, n, "scalable init");
    EXPECT_EQ(ncclCommAbort(comm), ncclSuccess);
  });
}

TEST(NcclApi, MemoryRegistrationAndWindows) {
  SKIP_WITHOUT_COMMUNICATORS();
  const int n = 2;
  const size_t count = 1 << 16;
  World world(n);
  std::vector<void*> memory(n, nullptr);
  std::vector<void*> handles(n, nullptr);
  std::vector<ncclWindow_t> windows(n, nullptr);
  for (int r = 0; r < n; ++r) {
    if (!hostMode()) cudaSetDevice(r % visibleDevices());
    ASSERT_EQ(ncclMemAlloc(&memory[r], count * sizeof(float)), ncclSuccess) << ncclGetLastError(nullptr);
    if (hostMode()) {
      std::vector<float> values = inputs<float>(r, count);
      std::memcpy(memory[r], values.data(), count * sizeof(float));
    } else {
      std::vector<float> values = inputs<float>(r, count);
      ASSERT_EQ(cudaMemcpy(memory[r], values.data(), count * sizeof(float), cudaMemcpyHostToDevice), cudaSuccess);
    }
    ASSERT_EQ(ncclCommRegister(world.comms[r], memory[r], count * sizeof(float), &handles[r]), ncclSuccess);
  }
  // Windows are collective in NCCL: one group.
  world.run([&](int r) {
    return ncclCommWindowRegister(world.comms[r], memory[r], count * sizeof(float), &windows[r],
                                  NCCL_WIN_COLL_SYMMETRIC);
  });
  world.run([&](int r) {
    return ncclAllReduce(memory[r], memory[r], count, ncclFloat, ncclSum, world.comms[r], world.streams[r]);
  });
  for (int r = 0; r < n; ++r) {
    std::vector<float> got(count);
    if (hostMode()) {
      std::memcpy(got.data(), memory[r], count * sizeof(float));
    } else {
      ASSERT_EQ(cudaMemcpy(got.data(), memory[r], count * sizeof(float), cudaMemcpyDeviceToHost), cudaSuccess);
    }
    for (size_t i = 0; i < count; ++i) ASSERT_EQ(got[i], input(0, i) + input(1, i));
  }
  ncclWindow_t refused = nullptr;
  EXPECT_EQ(ncclCommWindowRegister(world.comms[0], memory[0], 64, &refused, 0x40), ncclInvalidArgument);
  for (int r = 0; r < n; ++r) {
    EXPECT_EQ(ncclCommWindowDeregister(world.comms[r], windows[r]), ncclSuccess);
    EXPECT_EQ(ncclCommDeregister(world.comms[r], handles[r]), ncclSuccess);
    EXPECT_EQ(ncclMemFree(memory[r]), ncclSuccess);
  }
  EXPECT_EQ(ncclCommDeregister(world.comms[0], handles[0]), ncclInvalidArgument);
  EXPECT_EQ(ncclMemFree(nullptr), ncclSuccess);
}

TEST(NcclApi, GroupSimulateEndRunsNothing) {
  SKIP_WITHOUT_COMMUNICATORS();
  const int n = 2;
  const size_t count = 1 << 18;
  World world(n);
  auto buffer = buffers<float>(n, count, 1.0f);
  ASSERT_EQ(ncclGroupStart(), ncclSuccess);
  for (int r = 0; r < n; ++r)
    ASSERT_EQ(
        ncclAllReduce(buffer[r]->get(), buffer[r]->get(), count, ncclFloat, ncclSum, world.comms[r], world.streams[r]),
        ncclSuccess);
  ncclSimInfo_t info = NCCL_SIM_INFO_INITIALIZER;
  ASSERT_EQ(ncclGroupSimulateEnd(&info), ncclSuccess) << ncclGetLastError(nullptr);
  EXPECT_GT(info.estimatedTime, 0.0f);
  for (int r = 0; r < n; ++r) EXPECT_EQ(buffer[r]->download()[0], 1.0f);
  // The group is closed: an end without a start is an error.
  EXPECT_EQ(ncclGroupEnd(), ncclInvalidUsage);
  ncclSimInfo_t unset;
  std::memset(&unset, 0, sizeof(unset));
  EXPECT_EQ(ncclGroupSimulateEnd(&unset), ncclInvalidArgument);
}

TEST(NcclApi, RefusalsAndBadArguments) {
  SKIP_WITHOUT_COMMUNICATORS();
  World world(2);
  ncclComm_t comm = world.comms[0];
  int exclude = 1;
  ncclComm_t shrunk = nullptr;
  int self = 0;
  EXPECT_EQ(ncclCommShrink(comm, &self, 1, &shrunk, nullptr, NCCL_SHRINK_DEFAULT), ncclInvalidArgument);
  EXPECT_NE(std::string(ncclGetLastError(comm)).find("in its own exclude list"), std::string::npos)
      << ncclGetLastError(comm);
  EXPECT_EQ(ncclCommShrink(comm, &exclude, 1, &shrunk, nullptr, 0x8), ncclInvalidArgument);
  EXPECT_EQ(shrunk, nullptr);
  EXPECT_EQ(ncclCommRevoke(comm, 1), ncclInvalidArgument);
  EXPECT_NE(std::string(ncclGetLastError(comm)).find("revokeFlags"), std::string::npos) << ncclGetLastError(comm);
  EXPECT_EQ(ncclCommRevoke(nullptr, NCCL_REVOKE_DEFAULT), ncclInvalidArgument);
  Buffer<float> buffer(16);
  EXPECT_EQ(
      ncclAllReduce(buffer.get(), buffer.get(), 16, static_cast<ncclDataType_t>(99), ncclSum, comm, world.streams[0]),
      ncclInvalidArgument);
  EXPECT_NE(std::string(ncclGetLastError(comm)).find("datatype 99"), std::string::npos);
  EXPECT_EQ(
      ncclAllReduce(buffer.get(), buffer.get(), 16, ncclFloat, static_cast<ncclRedOp_t>(40), comm, world.streams[0]),
      ncclInvalidArgument);
  EXPECT_EQ(ncclAllReduce(buffer.get(), buffer.get(), 16, ncclFloat, ncclSum, nullptr, world.streams[0]),
            ncclInvalidArgument);
  EXPECT_EQ(ncclBroadcast(buffer.get(), buffer.get(), 16, ncclFloat, 5, comm, world.streams[0]), ncclInvalidArgument);
  EXPECT_NE(std::string(ncclGetLastError(comm)).find("root"), std::string::npos) << ncclGetLastError(comm);
  EXPECT_EQ(ncclCommCount(nullptr, &exclude), ncclInvalidArgument);
  // A config not made from NCCL_CONFIG_INITIALIZER.
  ncclConfig_t config;
  std::memset(&config, 0, sizeof(config));
  ncclUniqueId id;
  ASSERT_EQ(ncclGetUniqueId(&id), ncclSuccess);
  ncclComm_t never = nullptr;
  EXPECT_EQ(ncclCommInitRankConfig(&never, 1, id, 0, &config), ncclInvalidArgument);
  EXPECT_NE(std::string(ncclGetLastError(nullptr)).find("NCCL_CONFIG_INITIALIZER"), std::string::npos);
  EXPECT_EQ(never, nullptr);
  EXPECT_EQ(ncclCommInitRank(&never, 2, id, 2), ncclInvalidArgument);
  EXPECT_EQ(ncclCommInitAll(nullptr, 2, nullptr), ncclInvalidArgument);
  // Destroying and aborting nothing is fine, as in NCCL.
  EXPECT_EQ(ncclCommDestroy(nullptr), ncclSuccess);
  EXPECT_EQ(ncclCommAbort(nullptr), ncclSuccess);
  // Nothing above changed the communicators: they still work.
  auto values = buffers<float>(2, 16, 3.0f);
  world.run([&](int r) {
    return ncclAllReduce(values[r]->get(), values[r]->get(), 16, ncclFloat, ncclSum, world.comms[r], world.streams[r]);
  });
  EXPECT_EQ(values[1]->download()[15], 6.0f);
}

// Revoke ends what is in flight and fails what follows without freeing: both ranks' calls after it fail (the
// revoked one at once, its peer through the FIFOs they share), and destroy then frees.
TEST(NcclApi, RevokeFailsLaterCallsAndDestroyFollows) {
  SKIP_WITHOUT_COMMUNICATORS();
  World world(2);
  auto values = buffers<float>(2, 16, 1.0f);
  world.run([&](int r) {
    return ncclAllReduce(values[r]->get(), values[r]->get(), 16, ncclFloat, ncclSum, world.comms[r], world.streams[r]);
  });
  ASSERT_EQ(ncclCommRevoke(world.comms[0], NCCL_REVOKE_DEFAULT), ncclSuccess);
  std::vector<ncclResult_t> results(2, ncclSuccess);
  std::vector<std::thread> ranks;
  for (int r = 0; r < 2; ++r)
    ranks.emplace_back([&, r] {
      results[r] = ncclAllReduce(values[r]->get(), values[r]->get(), 16, ncclFloat, ncclSum, world.comms[r],
                                 world.streams[r]);
      if (results[r] == ncclSuccess && world.streams[r] != nullptr) {  // a CUDA communicator fails on its stream
        cudaStreamSynchronize(world.streams[r]);
        ncclCommGetAsyncError(world.comms[r], &results[r]);
      }
    });
  for (std::thread& rank : ranks) rank.join();
  EXPECT_NE(results[0], ncclSuccess);
  EXPECT_NE(results[1], ncclSuccess);
}

TEST(NcclApi, AbortReturnsPromptly) {
  SKIP_WITHOUT_COMMUNICATORS();
  World world(3);
  auto start = std::chrono::steady_clock::now();
  for (ncclComm_t& comm : world.comms) {
    EXPECT_EQ(ncclCommAbort(comm), ncclSuccess);
    comm = nullptr;
  }
  EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(30));
}

}  // namespace
