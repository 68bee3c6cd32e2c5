// The FIFO and its two protocols, between two threads of one process over plain memory: every message arrives
// whole and in order under both protocols (and when they alternate), flow control stops a sender at `depth`
// unreleased messages, the abort flag, with the first failure behind it, is seen by both ends, and a retained
// message the receiver asks for again comes back as it was first written (LOOM_CHECKSUM=2), also through a relay
// that keeps what it sent until the receiver released it (the tcp proxies).
#include "transports/fifo.h"

#include <gtest/gtest.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include <atomic>
#include <cstdlib>
#include <cstring>
#include <thread>
#include <vector>

#include "transports/fifo_protocol.h"

namespace loom {
namespace {

struct Fifo {
  explicit Fifo(FifoShape shape)
      : shape(shape),
        memory(static_cast<std::byte*>(std::aligned_alloc(4096, (fifoBytes(shape) + 4095) / 4096 * 4096))) {
    fifoInit(memory, shape);
  }
  ~Fifo() { std::free(memory); }
  FifoShape shape;
  std::byte* memory;
};

Protocol protocolOf(size_t index) { return index % 3 == 0 ? Protocol::kLL : Protocol::kSimple; }

// Message `index` of the stream: its protocol alternates, its size varies up to a full slot, its bytes are a
// function of index and position.
Protocol makeMessage(const FifoShape& shape, size_t index, std::vector<uint8_t>* message) {
  Protocol protocol = protocolOf(index);
  message->resize(1 + (index * 37) % fifoPayloadBytes(shape, protocol));
  for (size_t i = 0; i < message->size(); ++i) (*message)[i] = static_cast<uint8_t>(index * 31 + i * 7);
  return protocol;
}

// Receives `count` messages of the stream from `fifo`, damaging every 5th and asking for it again; each must come
// back as written. Adds the requests made to *resends.
void receiveDamagingEveryFifth(const Fifo& fifo, size_t count, size_t* resends) {
  FifoReceiver in(fifoView(fifo.memory));
  std::vector<uint8_t> expected;
  for (size_t m = 0; m < count; ++m) {
    Protocol protocol = makeMessage(fifo.shape, m, &expected);
    for (bool asked = false;;) {
      size_t bytes = 0;
      bool direct = false;
      const void* got = nullptr;
      while ((got = in.poll(protocol, &bytes, &direct)) == nullptr) std::this_thread::yield();
      ASSERT_EQ(bytes, expected.size()) << m;
      EXPECT_EQ(in.resent(), asked) << m;
      if (m % 5 == 0 && !asked) {
        // Damage the copy a reader sees (the slot for Simple, the decoded staging for LL), then ask again.
        const_cast<uint8_t*>(static_cast<const uint8_t*>(got))[0] ^= 0x10;
        in.askResend();
        EXPECT_TRUE(in.empty());  // the message in hand is no good while it is sent again
        asked = true;
        ++*resends;
        continue;
      }
      ASSERT_EQ(std::memcmp(got, expected.data(), bytes), 0) << "message " << m << (asked ? ", sent again" : "");
      in.release();
      break;
    }
  }
}

TEST(Fifo, MessagesArriveWholeAndInOrder) {
  Fifo fifo({4, 8192, 1024});
  const size_t kMessages = 5000;
  std::thread sender([&] {
    FifoSender out(fifoView(fifo.memory));
    std::vector<uint8_t> message;
    for (size_t m = 0; m < kMessages; ++m) {
      Protocol protocol = makeMessage(fifo.shape, m, &message);
      size_t bytes = message.size();
      void* slot = nullptr;
      while ((slot = out.reserve(protocol)) == nullptr) std::this_thread::yield();
      std::memcpy(slot, message.data(), bytes);
      out.post(protocol, bytes);
    }
  });
  FifoReceiver in(fifoView(fifo.memory));
  std::vector<uint8_t> expected;
  for (size_t m = 0; m < kMessages; ++m) {
    Protocol protocol = makeMessage(fifo.shape, m, &expected);
    size_t bytes = expected.size();
    const void* data = nullptr;
    size_t got = 0;
    bool direct = true;
    while ((data = in.poll(protocol, &got, &direct)) == nullptr) std::this_thread::yield();
    ASSERT_EQ(got, bytes) << "message " << m;
    ASSERT_FALSE(direct);
    ASSERT_EQ(std::memcmp(data, expected.data(), bytes), 0) << "message " << m << " " << protocolName(protocol);
    in.release();
  }
  sender.join();
}

TEST(Fifo, SenderStopsAtDepth) {
  Fifo fifo({3, 4096, 512});
  FifoSender out(fifoView(fifo.memory));
  FifoReceiver in(fifoView(fifo.memory));
  for (int m = 0; m < 3; ++m) {
    ASSERT_NE(out.reserve(Protocol::kSimple), nullptr);
    out.post(Protocol::kSimple, 8);
  }
  EXPECT_EQ(out.reserve(Protocol::kSimple), nullptr) << "a full FIFO must refuse a fourth message";
  size_t bytes = 0;
  bool direct = false;
  EXPECT_FALSE(out.drained());
  ASSERT_NE(in.poll(Protocol::kSimple, &bytes, &direct), nullptr);
  EXPECT_EQ(out.reserve(Protocol::kSimple), nullptr) << "polling alone does not free the slot";
  in.release();
  EXPECT_NE(out.reserve(Protocol::kSimple), nullptr);
  for (int m = 0; m < 2; ++m) {
    ASSERT_NE(in.poll(Protocol::kSimple, &bytes, &direct), nullptr);
    in.release();
  }
  EXPECT_TRUE(out.drained());
}

TEST(Fifo, DirectMessagesAreMarked) {
  Fifo fifo({2, 4096, 512});
  FifoSender out(fifoView(fifo.memory));
  FifoReceiver in(fifoView(fifo.memory));
  auto* descriptor = static_cast<DirectDescriptor*>(out.reserve(Protocol::kSimple));
  *descriptor = {0x1234, 1 << 20, 42, 0};
  out.post(Protocol::kSimple, 1 << 20, /*direct=*/true);
  size_t bytes = 0;
  bool direct = false;
  auto* got = static_cast<const DirectDescriptor*>(in.poll(Protocol::kSimple, &bytes, &direct));
  ASSERT_NE(got, nullptr);
  EXPECT_TRUE(direct);
  EXPECT_EQ(bytes, size_t{1} << 20);
  EXPECT_EQ(got->address, 0x1234u);
  EXPECT_EQ(got->pid, 42);
}

// Two threads, every message retained; the receiver damages every 5th message it polls and asks for it again:
// it gets the message as first written, under both protocols, in order, and nothing else goes amiss.
TEST(Fifo, AMessageAskedForAgainComesBackAsWritten) {
  Fifo fifo({4, 8192, 1024});
  const size_t kMessages = 2000;
  std::atomic<bool> done{false};
  std::thread sender([&] {
    FifoSender out(fifoView(fifo.memory));
    std::vector<uint8_t> message;
    auto serve = [&] {
      size_t bytes = 0;
      bool direct = true;
      if (out.rewrite(&bytes, &direct) != nullptr) {
        EXPECT_FALSE(direct);
        out.repost();
      }
    };
    for (size_t m = 0; m < kMessages; ++m) {
      Protocol protocol = makeMessage(fifo.shape, m, &message);
      void* slot = nullptr;
      while ((slot = out.reserve(protocol)) == nullptr) {
        serve();
        std::this_thread::yield();
      }
      std::memcpy(slot, message.data(), message.size());
      out.retain(protocol, message.size());
      out.post(protocol, message.size());
      serve();
    }
    while (!done.load()) {
      serve();
      std::this_thread::yield();
    }
  });
  size_t resends = 0;
  receiveDamagingEveryFifth(fifo, kMessages, &resends);
  done.store(true);
  sender.join();
  EXPECT_EQ(resends, kMessages / 5);
}

// The tcp proxies under LOOM_CHECKSUM=2, without the network: a relay thread takes each message from the sender's
// FIFO without releasing it (peekAny), posts it into the receiver's, releases the sender's messages only as far as
// the receiver has released them (releaseThrough), and serves a request for a message again from the sender's
// FIFO into the slot the receiver kept (rewriteAt). The receiver damages every 5th message and asks for it again:
// every message arrives as written, in order, and the sender is never more than `depth` messages ahead.
TEST(Fifo, ARelayKeepsWhatItSentUntilReleasedAndSendsItAgain) {
  Fifo near({4, 8192, 1024}), far({4, 8192, 1024});
  const size_t kMessages = 2000;
  std::atomic<bool> done{false};
  std::thread sender([&] {
    FifoSender out(fifoView(near.memory));
    std::vector<uint8_t> message;
    for (size_t m = 0; m < kMessages; ++m) {
      Protocol protocol = makeMessage(near.shape, m, &message);
      void* slot = nullptr;
      while ((slot = out.reserve(protocol)) == nullptr) std::this_thread::yield();
      std::memcpy(slot, message.data(), message.size());
      out.post(protocol, message.size());
    }
  });
  std::thread relay([&] {
    FifoReceiver drain(fifoView(near.memory));
    FifoSender fill(fifoView(far.memory));
    const FifoHeader* farHeader = fifoView(far.memory).header;
    uint64_t next = 0, served = 0;
    while (!done.load()) {
      drain.releaseThrough(farHeader->tail.load(std::memory_order_acquire));
      EXPECT_LE(next - drain.released(), 4u);
      size_t bytes = 0;
      Protocol protocol = Protocol::kSimple;
      bool direct = false;
      const uint64_t wanted = farHeader->resendWanted.load(std::memory_order_acquire);
      if (wanted > served) {
        const void* message = drain.peekAny(wanted - 1, &bytes, &protocol, &direct);
        ASSERT_NE(message, nullptr) << "message " << wanted - 1 << " was released before the receiver checked it";
        void* to = fill.rewriteAt(wanted - 1, protocol, bytes);
        ASSERT_NE(to, nullptr);
        EXPECT_EQ(fill.rewriteAt(wanted, protocol, bytes), nullptr);  // not the one asked for
        std::memcpy(to, message, bytes);
        fill.repost();
        served = wanted;
        continue;
      }
      const void* message = drain.peekAny(next, &bytes, &protocol, &direct);
      void* to = message ? fill.reserve(protocol) : nullptr;
      if (to == nullptr) {
        std::this_thread::yield();
        continue;
      }
      std::memcpy(to, message, bytes);
      fill.post(protocol, bytes);
      ++next;
    }
    EXPECT_EQ(next, kMessages);
    EXPECT_EQ(drain.released(), kMessages);
  });
  size_t resends = 0;
  receiveDamagingEveryFifth(far, kMessages, &resends);
  sender.join();
  // The relay's last releases: the receiver has released everything.
  while (fifoView(near.memory).header->tail.load() < kMessages) std::this_thread::yield();
  done.store(true);
  relay.join();
  EXPECT_EQ(resends, kMessages / 5);
}

// Nothing is rewritten without a request, or for a message that was not retained.
TEST(Fifo, NothingIsRewrittenUnasked) {
  Fifo fifo({4, 8192, 1024});
  FifoSender out(fifoView(fifo.memory));
  FifoReceiver in(fifoView(fifo.memory));
  size_t bytes = 0;
  bool direct = false;
  void* slot = out.reserve(Protocol::kSimple);
  std::memset(slot, 7, 100);
  out.post(Protocol::kSimple, 100);  // not retained
  EXPECT_EQ(out.rewrite(&bytes, &direct), nullptr);
  ASSERT_NE(in.poll(Protocol::kSimple, &bytes, &direct), nullptr);
  in.askResend();
  EXPECT_EQ(out.rewrite(&bytes, &direct), nullptr);  // asked, but no copy was kept: the receiver's deadline ends it
  EXPECT_EQ(in.poll(Protocol::kSimple, &bytes, &direct), nullptr);
}

TEST(Fifo, NothingToReadOnAnEmptyFifo) {
  Fifo fifo({2, 4096, 512});
  FifoReceiver in(fifoView(fifo.memory));
  size_t bytes = 0;
  bool direct = false;
  EXPECT_EQ(in.poll(Protocol::kSimple, &bytes, &direct), nullptr);
  EXPECT_EQ(in.poll(Protocol::kLL, &bytes, &direct), nullptr);
}

TEST(Fifo, AbortIsSeenByBothEnds) {
  Fifo fifo({2, 4096, 512});
  FifoSender out(fifoView(fifo.memory));
  FifoReceiver in(fifoView(fifo.memory));
  EXPECT_FALSE(out.aborted());
  in.abort();
  EXPECT_TRUE(out.aborted());
  EXPECT_TRUE(in.aborted());
}

// The abort mark carries the first failure behind it; a later mark from either end keeps that one.
TEST(Fifo, AbortCarriesTheFirstFailure) {
  Fifo fifo({2, 4096, 512});
  FifoSender out(fifoView(fifo.memory));
  FifoReceiver in(fifoView(fifo.memory));
  EXPECT_EQ(out.abortOrigin(), 0u);
  const uint64_t killed = packOrigin({3, FailureCause::kKilled, 9});
  in.abort(killed);
  EXPECT_EQ(out.abortCode(), kAbortedByPeer);
  EXPECT_EQ(out.abortOrigin(), killed);
  out.abort(packOrigin({1, FailureCause::kDeadline, 0}));
  EXPECT_EQ(in.abortOrigin(), killed);
  out.abort();  // an end that knows nothing more changes nothing either
  EXPECT_EQ(in.abortOrigin(), killed);
}

TEST(FifoProtocol, FailureOriginsRoundTrip) {
  for (const FailureOrigin& origin :
       {FailureOrigin{0, FailureCause::kKilled, 9}, FailureOrigin{4095, FailureCause::kStopped, 0},
        FailureOrigin{static_cast<int>(kMaxOriginRank), FailureCause::kExited, 255},
        FailureOrigin{7, FailureCause::kLate, 0}}) {
    const uint64_t packed = packOrigin(origin);
    EXPECT_NE(packed, 0u);
    EXPECT_LT(packed, uint64_t{1} << 48) << "must fit the 48 bits every wire carries";
    const FailureOrigin back = unpackOrigin(packed);
    EXPECT_EQ(back.rank, origin.rank);
    EXPECT_EQ(back.cause, origin.cause);
    EXPECT_EQ(back.detail, origin.detail);
  }
  // A rank past what the word holds, or none, reads back as not known.
  EXPECT_EQ(unpackOrigin(packOrigin({static_cast<int>(kMaxOriginRank) + 1, FailureCause::kKilled, 9})).rank, -1);
  EXPECT_EQ(unpackOrigin(packOrigin({-1, FailureCause::kGone, 0})).rank, -1);
}

// A proxy forwards whatever was posted: pollAny tells LL from Simple by the slot's flag, over many rounds of
// the slots, and gives the same bytes poll() would.
TEST(Fifo, PollAnyTellsTheProtocol) {
  Fifo fifo({4, 4096, 512});
  FifoSender out(fifoView(fifo.memory));
  FifoReceiver in(fifoView(fifo.memory));
  std::vector<uint8_t> message;
  for (size_t index = 0; index < 40; ++index) {
    Protocol protocol = makeMessage(fifo.shape, index, &message);
    void* slot = out.reserve(protocol);
    ASSERT_NE(slot, nullptr);
    std::memcpy(slot, message.data(), message.size());
    out.post(protocol, message.size());
    size_t bytes = 0;
    bool direct = true;
    Protocol seen = Protocol::kSimple;
    const void* got = in.pollAny(&bytes, &seen, &direct);
    ASSERT_NE(got, nullptr) << "message " << index;
    EXPECT_EQ(seen, protocol) << "message " << index;
    EXPECT_FALSE(direct);
    ASSERT_EQ(bytes, message.size());
    EXPECT_EQ(std::memcmp(got, message.data(), bytes), 0) << "message " << index;
    in.release();
    EXPECT_EQ(in.pollAny(&bytes, &seen, &direct), nullptr);
  }
}

// A FIFO with a doorbell rings it on post, release and abort while its proxy sleeps, and not otherwise.
TEST(Fifo, DoorbellRingsOnlyWhileTheProxySleeps) {
  Fifo fifo({2, 4096, 512});
  int bell = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
  ASSERT_GE(bell, 0);
  fifoView(fifo.memory).header->doorbell = bell;
  FifoSender out(fifoView(fifo.memory));
  FifoReceiver in(fifoView(fifo.memory));
  auto rings = [&] {
    uint64_t count = 0;
    return read(bell, &count, sizeof(count)) == static_cast<ssize_t>(sizeof(count)) ? count : 0;
  };
  out.reserve(Protocol::kSimple);
  out.post(Protocol::kSimple, 8);
  EXPECT_EQ(rings(), 0u) << "awake: no ring";
  fifoView(fifo.memory).header->sleeping.store(1);
  size_t bytes = 0;
  bool direct = false;
  ASSERT_NE(in.poll(Protocol::kSimple, &bytes, &direct), nullptr);
  in.release();
  EXPECT_EQ(rings(), 1u) << "release";
  out.reserve(Protocol::kLL);
  out.post(Protocol::kLL, 8);
  EXPECT_EQ(rings(), 1u) << "post";
  out.abort();
  EXPECT_EQ(rings(), 1u) << "abort";
  close(bell);
}

}  // namespace
}  // namespace loom

namespace loom {
namespace {

// The protocol arithmetic a device shares with the host (fifo_protocol.h).
TEST(FifoProtocol, WordsAndFlags) {
  // LL words carry their data and flag apart; a flag is never 0 and changes from one message to the next, also
  // where the sequence wraps the 32-bit flag.
  for (uint64_t sequence : {uint64_t{0}, uint64_t{1}, uint64_t{0xfffffffe}, uint64_t{0xffffffff}, uint64_t{1} << 40}) {
    uint32_t flag = fifo::llFlag(sequence);
    EXPECT_NE(flag, 0u) << sequence;
    EXPECT_NE(flag, fifo::llFlag(sequence + 1)) << sequence;
    for (uint32_t data : {0u, 1u, 0xdeadbeefu, 0xffffffffu}) {
      uint64_t word = fifo::llWord(data, flag);
      EXPECT_EQ(fifo::llWordData(word), data);
      EXPECT_EQ(fifo::llWordFlag(word), flag);
    }
  }
  EXPECT_EQ(fifo::llDataWords(0), 0u);
  EXPECT_EQ(fifo::llDataWords(1), 1u);
  EXPECT_EQ(fifo::llDataWords(8), 2u);
  EXPECT_EQ(fifo::llPayloadBytes(16448), (16448 / 8 - 1) * 4u);
  // Simple size words keep the direct mark apart from the size.
  for (bool direct : {false, true}) {
    uint64_t word = fifo::simpleSizeWord(131072, direct);
    EXPECT_EQ(fifo::simpleSizeBytes(word), 131072u);
    EXPECT_EQ(fifo::simpleSizeDirect(word), direct);
  }
}

TEST(FifoProtocol, CreditAndSlots) {
  EXPECT_TRUE(fifo::hasCredit(3, 0, 4));
  EXPECT_FALSE(fifo::hasCredit(4, 0, 4));
  EXPECT_TRUE(fifo::hasCredit(uint64_t{1} << 40, (uint64_t{1} << 40) - 3, 4));
  uint32_t slot = 0;
  for (int i = 0; i < 9; ++i) slot = fifo::nextSlot(slot, 4);
  EXPECT_EQ(slot, 1u);
  // Every Simple slot, then every LL slot, back to back.
  EXPECT_EQ(fifo::simpleSlotOffset(3, 1000), 3000u);
  EXPECT_EQ(fifo::llSlotOffset(0, 4, 1000, 64), 4000u);
  EXPECT_EQ(fifo::llSlotOffset(3, 4, 1000, 64), 4192u);
}

}  // namespace
}  // namespace loom
