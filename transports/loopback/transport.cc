// loopback: connections between ranks that are threads of one process, through process-local memory.
//
// For tests and for single-process jobs: it exercises the same FIFO and protocols as shm with no files. The
// receiver publishes its FIFO in a process-wide table under the connection's name; the sender takes it out of
// the table (the in-process analogue of shm's unlink) and both hold it until the last end goes away.
#include "transports/transport.h"

#include <unistd.h>

#include <cstdlib>
#include <map>
#include <mutex>
#include <string>

#include "src/base/check.h"

namespace loom {
namespace {

struct Segment {
  explicit Segment(size_t bytes) : bytes(bytes), base(std::aligned_alloc(4096, (bytes + 4095) / 4096 * 4096)) {}
  ~Segment() { std::free(base); }
  size_t bytes;
  void* base;
};

std::mutex gTableMutex;
std::map<std::string, std::shared_ptr<Segment>>& table() {
  static std::map<std::string, std::shared_ptr<Segment>> segments;
  return segments;
}

class LoopbackEndpoint : public Endpoint {
 public:
  // `name` is set on the receiver's end: it withdraws its FIFO from the table if no sender ever took it.
  LoopbackEndpoint(std::shared_ptr<Segment> segment, std::string name)
      : segment_(std::move(segment)), name_(std::move(name)) {}
  ~LoopbackEndpoint() override {
    if (name_.empty()) return;
    std::lock_guard<std::mutex> lock(gTableMutex);
    auto found = table().find(name_);
    if (found != table().end() && found->second == segment_) table().erase(found);
  }
  FifoMemory fifo() override { return fifoView(segment_->base); }

 private:
  std::shared_ptr<Segment> segment_;
  std::string name_;
};

class LoopbackTransport : public Transport {
 public:
  const char* name() const override { return "loopback"; }

  TransportTraits traits() const override {
    TransportTraits traits;
    traits.carriesDirect = true;
    return traits;
  }

  bool canConnect(const PeerInfo& self, const PeerInfo& peer, std::string* why) const override {
    if (self.hostHash != peer.hostHash || self.pid != peer.pid) {
      *why = "ranks " + std::to_string(self.rank) + " and " + std::to_string(peer.rank) + " are in different processes";
      return false;
    }
    return true;
  }

  loomResult_t createReceiver(TransportComm*, const ConnectionKey& key, const FifoShape& shape,
                              std::unique_ptr<Endpoint>* out) override {
    auto segment = std::make_shared<Segment>(fifoBytes(shape));
    if (segment->base == nullptr)
      return LOOM_FAIL(loomSystemError, SHM, "cannot allocate %zu bytes for loopback connection %s", segment->bytes,
                       key.name().c_str());
    fifoInit(segment->base, shape);
    {
      std::lock_guard<std::mutex> lock(gTableMutex);
      table()[key.name()] = segment;
    }
    *out = std::make_unique<LoopbackEndpoint>(segment, key.name());
    return loomSuccess;
  }

  loomResult_t attachSender(TransportComm*, const ConnectionKey& key, const FifoShape&, const WaitCheck& check,
                            std::unique_ptr<Endpoint>* out) override {
    Backoff backoff;
    for (;;) {
      {
        std::lock_guard<std::mutex> lock(gTableMutex);
        auto found = table().find(key.name());
        if (found != table().end()) {
          static_cast<FifoHeader*>(found->second->base)->senderAttached.store(1);
          *out = std::make_unique<LoopbackEndpoint>(found->second, "");
          table().erase(found);
          return loomSuccess;
        }
      }
      LOOM_CHECK(check());
      backoff.pause();
    }
  }
};

}  // namespace

Transport* loopbackTransport() {
  static LoopbackTransport transport;
  return &transport;
}

}  // namespace loom
