// Backoff: spin with a CPU pause hint, then yield the CPU until LOOM_YIELD_US has passed, then short sleeps
// growing to 200 us. Yielding keeps latency low when ranks outnumber cores (the peer gets the core at once);
// sleeping only after a long wait keeps an idle rank from burning a core.
#include "src/base/wait.h"

#include <sched.h>
#include <time.h>

#include "src/base/params.h"

namespace loom {
namespace {
inline void cpuRelax() {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_ia32_pause();
#elif defined(__aarch64__)
  asm volatile("yield");
#endif
}
}  // namespace

Backoff::Backoff() : Backoff(kSpinPollsShared) {
  static const int64_t spinCount = params::spinCount();
  if (spinCount >= 0) spinLimit_ = spinCount;
}

Backoff::Backoff(int64_t spinPolls) : spinLimit_(spinPolls) {
  static const int64_t yieldUs = params::yieldUs();  // read once: a Backoff is made for every wait
  yieldMicros_ = yieldUs;
}

void Backoff::pause() {
  ++polls_;
  if (polls_ <= spinLimit_) {
    cpuRelax();
    return;
  }
  Clock::time_point now = Clock::now();
  if (polls_ == spinLimit_ + 1) waitStart_ = now;
  auto waited = std::chrono::duration_cast<std::chrono::microseconds>(now - waitStart_).count();
  if (waited < yieldMicros_) {
    sched_yield();
    return;
  }
  // Sleep grows by 10 us per 100 us waited, to a 200 us cap.
  int64_t micros = std::min<int64_t>(200, 10 + (waited - yieldMicros_) / 10);
  timespec nap{0, static_cast<long>(micros * 1000)};
  nanosleep(&nap, nullptr);
}

}  // namespace loom
