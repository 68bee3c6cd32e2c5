// Backoff: spin with a CPU pause hint, then sched_yield, then short sleeps growing to 200 us.
#include "src/core/wait.h"

#include <sched.h>
#include <time.h>

#include "src/core/params.h"

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

Backoff::Backoff() : spinLimit_(params::spinCount()) {}

void Backoff::pause() {
  ++polls_;
  if (polls_ <= spinLimit_) {
    cpuRelax();
  } else if (polls_ <= spinLimit_ + 64) {
    sched_yield();
  } else {
    // Sleep grows 10us per extra poll to a 200us cap: a peer needing the CPU gets it; latency stays bounded.
    int64_t micros = std::min<int64_t>(200, 10 * (polls_ - spinLimit_ - 64));
    timespec nap{0, static_cast<long>(micros * 1000)};
    nanosleep(&nap, nullptr);
  }
}

}  // namespace loom
