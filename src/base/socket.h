// Socket helpers for the bootstrap: "host:port" / "[v6]:port" addresses, the interface to listen on, listen,
// connect with retries, exact reads and writes that honour a deadline and an abort flag, the challenge-response
// handshake that proves both ends know a 128-bit secret, and a poll() server that authenticates every client
// before it reads anything else. Every socket is CLOEXEC, non-blocking and TCP_NODELAY. Nothing here knows about ranks
// or message formats beyond the handshake; there is no TLS: the secret authenticates, it does not encrypt.
#pragma once

#include <sys/socket.h>

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "loom/loom.h"
#include "src/base/wait.h"

namespace loom {

// Owns one file descriptor; closes it on destruction.
class UniqueFd {
 public:
  UniqueFd() = default;
  explicit UniqueFd(int fd) : fd_(fd) {}
  UniqueFd(UniqueFd&& other) noexcept : fd_(other.release()) {}
  UniqueFd& operator=(UniqueFd&& other) noexcept {
    if (this != &other) reset(other.release());
    return *this;
  }
  UniqueFd(const UniqueFd&) = delete;
  UniqueFd& operator=(const UniqueFd&) = delete;
  ~UniqueFd() { reset(); }

  int get() const { return fd_; }
  bool valid() const { return fd_ >= 0; }
  int release() {
    int fd = fd_;
    fd_ = -1;
    return fd;
  }
  void reset(int fd = -1);

 private:
  int fd_ = -1;
};

// Where a blocking call gives up: past `deadline` (loomTimeout) or once *abortFlag is true (loomRemoteError).
// `operation` starts every error message ("bootstrap allGather of rank 2").
struct IoWait {
  Deadline deadline;
  const std::atomic<bool>* abortFlag = nullptr;
  std::string operation;

  bool aborted() const { return abortFlag != nullptr && abortFlag->load(std::memory_order_relaxed); }
};

// Blocking calls sleep in poll() for at most this long before they look at the deadline and abort flag again.
constexpr int kPollSliceMs = 100;

struct SocketAddress {
  sockaddr_storage storage{};
  socklen_t length = 0;
};

// Splits "host:port" or "[v6]:port" (port 0..65535); false when the text has neither form.
bool splitHostPort(const std::string& text, std::string* host, int* port);
// Resolves `text` (numeric or a host name) to a socket address; loomInvalidArgument when it does not parse.
loomResult_t resolveAddress(const std::string& text, SocketAddress* out);
// "1.2.3.4:5" or "[fe80::1%eth0]:5".
std::string formatAddress(const SocketAddress& address);
// The local address of a bound or connected socket.
loomResult_t localAddress(int fd, SocketAddress* out);
void setPort(SocketAddress* address, int port);
// True for an IP literal ("10.0.0.1", "::1"), false for a host name.
bool isNumericHost(const std::string& host);
bool isLoopback(const SocketAddress& address);
// The any-address of the same family as `address`, with its port.
SocketAddress wildcardOf(const SocketAddress& address);

// Which interfaces LOOM_SOCKET_IFNAME allows, in NCCL's syntax: a comma list of name prefixes ("eth,ib"),
// "^" before it to exclude them instead ("^docker,lo"), "=" to match whole names ("=eth0", "^=eth1").
struct InterfaceFilter {
  bool exclude = false;
  bool exact = false;
  std::vector<std::string> names;
};
InterfaceFilter parseInterfaceFilter(const std::string& spec);
bool interfaceMatches(const InterfaceFilter& filter, const std::string& name);
// The interface that holds the address of `hostPort` ("10.0.0.1:5000", "[::1]:5000"); "" when none here does.
std::string interfaceHolding(const std::string& hostPort);

// The address (port 0) to listen on: with LOOM_SOCKET_IFNAME, the first up interface it allows (IPv4, then
// global IPv6, then link-local IPv6); without, the first up IPv4 interface other than docker bridges and
// loopback, else 127.0.0.1. LOOM_SOCKET_FAMILY=AF_INET6 (or AF_INET) keeps only that family (::1 by default).
loomResult_t chooseListenAddress(SocketAddress* out);

// Listens on `address` (port 0 picks a free one) and returns the address it is bound to in *boundAddress.
loomResult_t listenOn(const SocketAddress& address, bool reuseAddress, UniqueFd* out, std::string* boundAddress);
// Accepts one pending connection; *out stays invalid when none is pending (or it vanished before accept).
loomResult_t acceptOne(int listenFd, UniqueFd* out, std::string* peerName);
// Connects to `address`. With `untilListening`, refused or unreachable attempts are retried until the deadline
// (a root may not be up yet); without it a refusal is final (loomRemoteError): the listener has gone.
loomResult_t connectTo(const std::string& address, bool untilListening, const IoWait& wait, UniqueFd* out);

// Reads or writes exactly `bytes`; `peer` names the other end in error messages ("rank 3", "the root at ...").
// A closed or reset connection is loomRemoteError.
loomResult_t readExact(int fd, void* data, size_t bytes, const std::string& peer, const IoWait& wait);
loomResult_t writeExact(int fd, const void* data, size_t bytes, const std::string& peer, const IoWait& wait);
// Sends on one socket while receiving on another, so that a ring of ranks all sending large blocks at once
// cannot deadlock on full socket buffers.
loomResult_t exchange(int sendFd, const void* sendData, size_t sendBytes, const std::string& sendPeer, int recvFd,
                      void* recvData, size_t recvBytes, const std::string& recvPeer, const IoWait& wait);

// getrandom(): secrets and nonces.
loomResult_t randomBytes(void* out, size_t bytes);

// The handshake. The accepting side sends a random challenge nonce; the connecting side answers with
// SipHash-2-4(secret, challenge || role) and a nonce of its own; the acceptor checks the tag and proves itself
// back with SipHash-2-4(secret, connector nonce || role | 0x80). The role byte keeps a tag made for one kind of
// connection from being replayed on another, and the 0x80 bit keeps an acceptor's proof from serving as a
// connector's tag.
enum class AuthRole : uint8_t { kRoot = 1, kPeer = 2 };
constexpr size_t kAuthSecretBytes = 16;
constexpr size_t kNonceBytes = 16;
constexpr size_t kAuthTagBytes = 8;
constexpr size_t kAuthAnswerBytes = kAuthTagBytes + kNonceBytes;

void authTag(const uint8_t* secret, const uint8_t* nonce, uint8_t role, uint8_t tag[kAuthTagBytes]);
// Acceptor side: checks `answer` (kAuthAnswerBytes) against the challenge it sent, in constant time. On success
// fills the proof to send back.
bool checkAuthAnswer(const uint8_t* secret, const uint8_t* challenge, AuthRole role, const uint8_t* answer,
                     uint8_t proof[kAuthTagBytes]);
// Connector side, blocking: answers the acceptor's challenge and checks its proof.
loomResult_t authenticateToAcceptor(int fd, const uint8_t* secret, AuthRole role, const std::string& peer,
                                    const IoWait& wait);

// A non-blocking connection driven by a poll() loop elsewhere: fills the input buffer to the size given to
// expect() and drains queued output as the socket accepts it. Servers use it so that no single client can
// block them.
class StreamConn {
 public:
  enum class Progress { kNone, kSome, kClosed, kFailed };

  StreamConn(UniqueFd fd, std::string peerName) : fd_(std::move(fd)), peerName_(std::move(peerName)) {}

  int fd() const { return fd_.get(); }
  const std::string& peerName() const { return peerName_; }
  UniqueFd releaseFd() { return std::move(fd_); }

  // Starts reading a new message of exactly `bytes` bytes.
  void expect(size_t bytes);
  bool inputComplete() const { return received_ == input_.size(); }
  size_t inputReceived() const { return received_; }
  std::vector<uint8_t>& input() { return input_; }

  void queue(const void* data, size_t bytes);
  bool outputPending() const { return sent_ < output_.size(); }

  short pollEvents() const;
  // Each does at most what the socket allows without blocking. kFailed leaves the reason in errno.
  Progress readSome();
  Progress writeSome();

 private:
  UniqueFd fd_;
  std::string peerName_;
  std::vector<uint8_t> input_;
  size_t received_ = 0;
  std::vector<uint8_t> output_;
  size_t sent_ = 0;
};

// A poll() server that authenticates every connection before it reads anything else from it. It accepts on a
// listener, challenges each connection and hands the authenticated ones to the subclass, which reads fixed-size
// inputs (expectInput / onMessage) and queues replies. One thread polls the listener, an optional wake-up fd and
// every connection; each connection is a small state machine with its own deadline, so a client that is slow,
// silent or malicious delays no one else. Connections that fail are dropped with a WARN naming the peer.
class AuthServer {
 public:
  virtual ~AuthServer() = default;

 protected:
  static constexpr int kStageAuth = 0;  // subclasses number their stages from 1
  struct Conn {
    explicit Conn(StreamConn stream) : io(std::move(stream)) {}
    StreamConn io;
    int stage = kStageAuth;
    int rank = -1;  // once the peer has said who it is
    int tag = 0;    // subclass scratch: the tag of the frame being read
    uint8_t challenge[kNonceBytes];
    Clock::time_point deadline = Clock::time_point::max();
    bool reading = false;           // waiting for the input given to expectInput()
    bool closeWhenFlushed = false;  // a reply is queued, then the connection ends
    bool dead = false;              // removed at the end of the round
  };

  // `name` starts every log line ("bootstrap root at 1.2.3.4:5"). A connection must finish the handshake and
  // each message the subclass gives it a deadline for within LOOM_BOOTSTRAP_HANDSHAKE_MS.
  AuthServer(UniqueFd listener, const uint8_t* secret, AuthRole role, std::string name);

  // The connection passed the handshake: set its stage and what to read next.
  virtual void onAuthenticated(Conn& conn) = 0;
  // The input asked for with expectInput() has arrived in conn.io.input().
  virtual void onMessage(Conn& conn) = 0;
  // The connection ends for any reason other than an intended close (closeWhenFlushed or dead set directly).
  virtual void onGone(Conn&) {}
  // The peer closed the connection; by default a protocol failure.
  virtual void onEof(Conn& conn);
  // The stage as a noun phrase for messages: "it closed the connection during <...>".
  virtual const char* describeStage(const Conn& conn) const;
  // accept() failed for a reason other than a client giving up (out of file descriptors, say): `why` is the
  // message. Listening pauses for a poll slice, then resumes.
  virtual void onAcceptFailed(const std::string& /*why*/) {}

  static void expectInput(Conn& conn, size_t bytes) {
    conn.io.expect(bytes);
    conn.reading = true;
  }
  void retire(Conn& conn);
  // WARNs with the reason and retires the connection.
  void drop(Conn& conn, const char* fmt, ...) __attribute__((format(printf, 3, 4)));
  // One round: waits up to `timeoutMs` for activity, serves it, then drops connections past their deadline.
  // *woken is set when `wakeFd` (ignored when negative) became readable.
  void serveOnce(int timeoutMs, int wakeFd, bool* woken);

  UniqueFd listener_;
  uint8_t secret_[kAuthSecretBytes];
  AuthRole role_;
  std::string name_;
  int64_t handshakeMs_;
  std::vector<std::unique_ptr<Conn>> conns_;

 private:
  void acceptPending();
  void serve(Conn& conn, short revents);
  void flush(Conn& conn);
  void pump(Conn& conn);
  void handle(Conn& conn);

  Clock::time_point listenPausedUntil_{};
};

}  // namespace loom
