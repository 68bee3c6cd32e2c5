// shm: connections between processes (or threads) of one host through files in LOOM_SHM_DIR (a tmpfs).
//
// The receiver creates the file (O_EXCL, space reserved with posix_fallocate so a full /dev/shm fails here, with
// the bytes needed, rather than with SIGBUS later), maps it and initialises the FIFO. The sender waits for the
// file, maps it, marks itself attached and unlinks it: from then on nothing is left in the directory, whatever
// happens to either process. A receiver whose sender never came unlinks the file when it is destroyed; a sender
// that leaves a failed communicator unlinks those made for it (the receiver may be stopped, or dead).
#include "transports/transport.h"

#include <dirent.h>
#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <string>

#include "src/base/check.h"
#include "src/base/params.h"

namespace loom {
namespace {

class ShmEndpoint : public Endpoint {
 public:
  ShmEndpoint(void* base, size_t bytes, std::string path, bool ownsName)
      : base_(base), bytes_(bytes), path_(std::move(path)), ownsName_(ownsName) {}
  ~ShmEndpoint() override {
    if (ownsName_) unlink(path_.c_str());  // ENOENT when the sender already did: fine
    munmap(base_, bytes_);
  }
  FifoMemory fifo() override { return fifoView(base_); }

 private:
  void* base_;
  size_t bytes_;
  std::string path_;
  bool ownsName_;
};

std::string segmentPath(const ConnectionKey& key) { return params::shmDir() + "/" + key.name(); }

class ShmTransport : public Transport {
 public:
  const char* name() const override { return "shm"; }

  TransportTraits traits() const override {
    TransportTraits traits;
    traits.carriesDirect = true;
    return traits;
  }

  bool canConnect(const PeerInfo& self, const PeerInfo& peer, std::string* why) const override {
    if (self.hostHash != peer.hostHash) {
      *why = "ranks " + std::to_string(self.rank) + " and " + std::to_string(peer.rank) + " are on different hosts";
      return false;
    }
    return true;
  }

  // Segments are named loom-<commHash>-<sender>-<receiver>-<channel> (ConnectionKey::name); the receiver made them.
  // Once the sender has attached, the name is gone; one still there waits for a sender that will never come if
  // that sender is `self`, leaving, and its receiver, dead or stopped, may never unlink it. cuda_ipc's records
  // (<name>.cuda, and .cuda.tmp while one is written) follow the same rule and match the same pattern: removed
  // alike (a receiver whose rename then fails was waiting for this rank, which is leaving).
  void removeLeftovers(uint64_t commHash, int self, const std::function<bool(int)>& dead) const override {
    const std::string dir = params::shmDir();
    char prefix[32];
    std::snprintf(prefix, sizeof(prefix), "loom-%016llx-", (unsigned long long)commHash);
    DIR* listing = opendir(dir.c_str());
    if (listing == nullptr) return;
    while (dirent* entry = readdir(listing)) {
      int sender = -1, receiver = -1, channel = -1;
      if (std::strncmp(entry->d_name, prefix, std::strlen(prefix)) != 0 ||
          std::sscanf(entry->d_name + std::strlen(prefix), "%d-%d-%d", &sender, &receiver, &channel) != 3)
        continue;
      if (sender == self || (receiver >= 0 && dead(receiver))) unlink((dir + "/" + entry->d_name).c_str());
    }
    closedir(listing);
  }

  loomResult_t createReceiver(TransportComm*, const ConnectionKey& key, const FifoShape& shape,
                              std::unique_ptr<Endpoint>* out) override {
    std::string path = segmentPath(key);
    size_t bytes = fifoBytes(shape);
    int fd = open(path.c_str(), O_RDWR | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
    if (fd < 0) return LOOM_FAIL(loomSystemError, SHM, "cannot create shared-memory segment %s: %m", path.c_str());
    int err = posix_fallocate(fd, 0, static_cast<off_t>(bytes));
    if (err != 0) {
      close(fd);
      unlink(path.c_str());
      errno = err;
      return LOOM_FAIL(loomSystemError, SHM,
                       "cannot reserve %zu bytes for %s: %m; make LOOM_SHM_DIR (now %s) point to a tmpfs with more "
                       "space, or enlarge it",
                       bytes, path.c_str(), params::shmDir().c_str());
    }
    void* base = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_POPULATE, fd, 0);
    close(fd);
    if (base == MAP_FAILED) {
      unlink(path.c_str());
      return LOOM_FAIL(loomSystemError, SHM, "cannot map %zu bytes of %s: %m", bytes, path.c_str());
    }
    fifoInit(base, shape);
    *out = std::make_unique<ShmEndpoint>(base, bytes, path, /*ownsName=*/true);
    return loomSuccess;
  }

  loomResult_t attachSender(TransportComm*, const ConnectionKey& key, const FifoShape& shape, const WaitCheck& check,
                            std::unique_ptr<Endpoint>* out) override {
    std::string path = segmentPath(key);
    size_t bytes = fifoBytes(shape);
    Backoff backoff;
    for (;;) {
      int fd = open(path.c_str(), O_RDWR | O_CLOEXEC);
      if (fd >= 0) {
        struct stat st {};
        // The receiver reserves the full size before it maps; a smaller file is still being set up.
        if (fstat(fd, &st) == 0 && static_cast<size_t>(st.st_size) >= bytes) {
          void* base = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_POPULATE, fd, 0);
          close(fd);
          if (base == MAP_FAILED) return LOOM_FAIL(loomSystemError, SHM, "cannot map %s: %m", path.c_str());
          auto* header = static_cast<FifoHeader*>(base);
          if (header->magic.load(std::memory_order_acquire) == kFifoMagic) {
            header->senderAttached.store(1, std::memory_order_release);
            unlink(path.c_str());
            *out = std::make_unique<ShmEndpoint>(base, bytes, path, /*ownsName=*/false);
            return loomSuccess;
          }
          munmap(base, bytes);  // still being initialised: look again
        } else {
          close(fd);
        }
      } else if (errno != ENOENT) {
        return LOOM_FAIL(loomSystemError, SHM, "cannot open shared-memory segment %s: %m", path.c_str());
      }
      LOOM_CHECK(check());
      backoff.pause();
    }
  }
};

}  // namespace

Transport* shmTransport() {
  static ShmTransport transport;
  return &transport;
}

}  // namespace loom
