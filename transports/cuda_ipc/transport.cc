// cuda_ipc: connections whose FIFOs lie in CUDA device memory, for the GPU executor
// (src/exec/cuda/device_executor.h) of CUDA communicators whose ranks share a machine: NVLink between GPUs, or
// one GPU's memory between ranks that share it.
//
// The receiver allocates the FIFO on its current device with cudaMalloc, zeroes it, copies the header over, and
// publishes it in a small file in LOOM_SHM_DIR named by the connection key: its process, device, address and
// cudaIpc handle, written to a temporary name and renamed, so a reader never sees half of it. The sender waits
// for the file, reads it and unlinks it; it maps the FIFO with cudaIpcOpenMemHandle, or, when the receiver is a
// thread of its own process (where CUDA refuses to open a handle), uses the address itself, with peer access
// enabled when the two are on different devices. A receiver whose sender never came unlinks the file when it is
// destroyed.
//
// The host never reads or writes these FIFOs after setup (TransportTraits::deviceMemory): Endpoint::fifo() gives device
// addresses. So the host executor never picks this transport; only the GPU executor's connections do.
#include "transports/transport.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "src/base/cuda_util.h"
#include "src/base/params.h"

namespace loom {
namespace {

constexpr uint32_t kRecordMagic = 0x6c6d6970;  // "lmip"

// What the receiver publishes.
struct IpcRecord {
  uint32_t magic;
  int32_t pid;
  int32_t device;
  uint32_t unused;
  uint64_t address;
  uint64_t bytes;
  cudaIpcMemHandle_t handle;
};

std::string recordPath(const ConnectionKey& key) { return params::shmDir() + "/" + key.name() + ".cuda"; }

class CudaIpcEndpoint : public Endpoint {
 public:
  enum class Kind { kOwned, kOpened, kSameProcess };
  CudaIpcEndpoint(Kind kind, void* memory, int device, std::string path)
      : kind_(kind), memory_(memory), device_(device), path_(std::move(path)) {}
  ~CudaIpcEndpoint() override {
    if (kind_ == Kind::kOwned) unlink(path_.c_str());  // ENOENT when the sender already did: fine
    DeviceScope scope(device_);
    if (kind_ == Kind::kOwned) cudaFree(memory_);
    if (kind_ == Kind::kOpened) cudaIpcCloseMemHandle(memory_);
    cudaGetLastError();  // a failure here (a context torn down at exit) concerns no later call
  }
  FifoMemory fifo() override { return fifoView(memory_); }

 private:
  Kind kind_;
  void* memory_;
  int device_;
  std::string path_;
};

// Writes `record` to `path` whole: under a temporary name first, then renamed.
loomResult_t publish(const std::string& path, const IpcRecord& record) {
  std::string temporary = path + ".tmp";
  int fd = open(temporary.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
  if (fd < 0) return LOOM_FAIL(loomSystemError, CUDA, "cuda_ipc: cannot create %s: %m", temporary.c_str());
  bool written = write(fd, &record, sizeof(record)) == static_cast<ssize_t>(sizeof(record));
  close(fd);
  if (!written || rename(temporary.c_str(), path.c_str()) != 0) {
    unlink(temporary.c_str());
    return LOOM_FAIL(loomSystemError, CUDA, "cuda_ipc: cannot publish %s: %m", path.c_str());
  }
  return loomSuccess;
}

class CudaIpcTransport : public Transport {
 public:
  const char* name() const override { return "cuda_ipc"; }
  TransportTraits traits() const override {
    TransportTraits traits;
    traits.deviceMemory = true;
    return traits;
  }

  bool canConnect(const PeerInfo& self, const PeerInfo& peer, std::string* why) const override {
    if (self.machineHash != peer.machineHash) {
      *why = "ranks " + std::to_string(self.rank) + " and " + std::to_string(peer.rank) +
             " are on different machines (CUDA IPC needs one kernel)";
      return false;
    }
    return true;
  }

  loomResult_t createReceiver(TransportComm*, const ConnectionKey& key, const FifoShape& shape,
                              std::unique_ptr<Endpoint>* out) override {
    const size_t bytes = fifoBytes(shape);
    int device = 0;
    LOOM_CUDA_CHECK(cudaGetDevice(&device), "cuda_ipc: cudaGetDevice");
    void* memory = nullptr;
    LOOM_CUDA_CHECK(cudaMalloc(&memory, bytes), "cuda_ipc: cudaMalloc of a FIFO");
    auto endpoint = std::make_unique<CudaIpcEndpoint>(CudaIpcEndpoint::Kind::kOwned, memory, device, recordPath(key));
    std::vector<std::byte> header(fifoHeaderBytes());
    fifoHeaderImage(header.data(), shape);
    cudaStream_t stream = nullptr;
    LOOM_CUDA_CHECK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), "cuda_ipc: cudaStreamCreate");
    cudaError_t error = cudaMemsetAsync(memory, 0, bytes, stream);
    if (error == cudaSuccess)
      error = cudaMemcpyAsync(memory, header.data(), header.size(), cudaMemcpyHostToDevice, stream);
    if (error == cudaSuccess) error = cudaStreamSynchronize(stream);
    cudaStreamDestroy(stream);
    if (error != cudaSuccess) return cudaFailed(error, "cuda_ipc: initialising a FIFO");
    IpcRecord record{};
    record.magic = kRecordMagic;
    record.pid = getpid();
    record.device = device;
    record.address = reinterpret_cast<uint64_t>(memory);
    record.bytes = bytes;
    LOOM_CUDA_CHECK(cudaIpcGetMemHandle(&record.handle, memory), "cuda_ipc: cudaIpcGetMemHandle");
    LOOM_CHECK(publish(recordPath(key), record));
    *out = std::move(endpoint);
    return loomSuccess;
  }

  loomResult_t attachSender(TransportComm*, const ConnectionKey& key, const FifoShape& shape, const WaitCheck& check,
                            std::unique_ptr<Endpoint>* out) override {
    const std::string path = recordPath(key);
    IpcRecord record{};
    Backoff backoff;
    for (;;) {
      int fd = open(path.c_str(), O_RDONLY | O_CLOEXEC);
      if (fd >= 0) {
        bool whole = read(fd, &record, sizeof(record)) == static_cast<ssize_t>(sizeof(record));
        close(fd);
        unlink(path.c_str());
        if (!whole || record.magic != kRecordMagic)
          return LOOM_FAIL(loomSystemError, CUDA, "cuda_ipc: %s is not a FIFO record", path.c_str());
        break;
      }
      if (errno != ENOENT) return LOOM_FAIL(loomSystemError, CUDA, "cuda_ipc: cannot open %s: %m", path.c_str());
      LOOM_CHECK(check());
      backoff.pause();
    }
    if (record.bytes != fifoBytes(shape))
      return LOOM_FAIL(loomInternalError, CUDA, "cuda_ipc: %s holds a FIFO of %llu bytes, expected %zu", path.c_str(),
                       (unsigned long long)record.bytes, fifoBytes(shape));
    int device = 0;
    LOOM_CUDA_CHECK(cudaGetDevice(&device), "cuda_ipc: cudaGetDevice");
    if (record.pid == getpid()) {
      if (record.device != device) {
        cudaError_t error = cudaDeviceEnablePeerAccess(record.device, 0);
        if (error == cudaErrorPeerAccessAlreadyEnabled) {
          cudaGetLastError();
        } else if (error != cudaSuccess) {
          return cudaFailed(error, "cuda_ipc: cudaDeviceEnablePeerAccess (two devices of one process)");
        }
      }
      *out = std::make_unique<CudaIpcEndpoint>(CudaIpcEndpoint::Kind::kSameProcess,
                                               reinterpret_cast<void*>(record.address), device, path);
      return loomSuccess;
    }
    void* memory = nullptr;
    LOOM_CUDA_CHECK(cudaIpcOpenMemHandle(&memory, record.handle, cudaIpcMemLazyEnablePeerAccess),
                    "cuda_ipc: cudaIpcOpenMemHandle of a peer's FIFO");
    *out = std::make_unique<CudaIpcEndpoint>(CudaIpcEndpoint::Kind::kOpened, memory, device, path);
    return loomSuccess;
  }
};

}  // namespace

Transport* cudaIpcTransport() {
  static CudaIpcTransport transport;
  return &transport;
}

}  // namespace loom
