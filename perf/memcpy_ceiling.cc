// The ceiling that shared-memory collectives are measured against: the memcpy bandwidth each of P concurrent
// copiers gets on buffers far larger than the caches. The n ranks of a collective on one host copy at the same
// time and share the memory system, so the bound for n ranks uses P = n (docs/PERFORMANCE.md, "The ceiling",
// turns it into a busbw bound per collective). Copiers are threads, each with its own source and target, started
// together for each repetition; a repetition's rate per copier is bytes / (first start to last end), so every
// copier counts as copying for the whole span. Prints the best and the median rate per copier in GB/s (1e9
// bytes copied per second, as nccl-tests counts).
// Usage: memcpy_ceiling [-p copiers (1)] [bytes (256M; K, M, G suffixes)] [repetitions (10)]
#include <getopt.h>

#include <algorithm>
#include <barrier>
#include <cctype>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <thread>
#include <vector>

namespace {

using Clock = std::chrono::steady_clock;

const char kUsage[] = "usage: memcpy_ceiling [-p copiers >= 1] [bytes > 0, K/M/G suffixes] [repetitions >= 1]\n";

// "256M", "1G", "4096": 0 when the text is not a byte count.
size_t parseBytes(const char* text) {
  char* end = nullptr;
  double value = strtod(text, &end);
  if (end == text || !(value > 0)) return 0;
  if (*end) {
    const char* units = "KMG";
    const char* unit = strchr(units, toupper(static_cast<unsigned char>(*end)));
    if (!unit || end[1] != '\0') return 0;
    value = std::ldexp(value, 10 * static_cast<int>(unit - units + 1));
  }
  return static_cast<size_t>(value);
}

struct Span {
  Clock::time_point start, end;
};

}  // namespace

int main(int argc, char** argv) {
  int copiers = 1;
  for (int c; (c = getopt(argc, argv, "hp:")) != -1;) {
    if (c == 'p') {
      copiers = atoi(optarg);
    } else {
      fputs(kUsage, c == 'h' ? stdout : stderr);
      return c == 'h' ? 0 : 2;
    }
  }
  size_t bytes = optind < argc ? parseBytes(argv[optind]) : size_t{256} << 20;
  int repetitions = optind + 1 < argc ? atoi(argv[optind + 1]) : 10;
  if (bytes == 0 || repetitions < 1 || copiers < 1 || optind + 2 < argc) {
    fputs(kUsage, stderr);
    return 2;
  }

  std::vector<std::vector<Span>> spans(repetitions, std::vector<Span>(copiers));
  std::vector<char> checks(copiers);
  std::barrier start(copiers);
  auto copier = [&](int p) {
    // Each copier touches its own buffers first, so pages are mapped (and local) before any timing.
    std::vector<char> source(bytes, 1), target(bytes, 0);
    for (int r = 0; r < repetitions; ++r) {
      start.arrive_and_wait();
      spans[r][p].start = Clock::now();
      memcpy(target.data(), source.data(), bytes);
      spans[r][p].end = Clock::now();
    }
    checks[p] = target[bytes / 2];  // keeps the copies observable
  };
  std::vector<std::thread> threads;
  for (int p = 1; p < copiers; ++p) threads.emplace_back(copier, p);
  copier(0);
  for (std::thread& thread : threads) thread.join();

  std::vector<double> rates;
  for (const std::vector<Span>& repetition : spans) {
    auto first = std::min_element(repetition.begin(), repetition.end(),
                                  [](const Span& a, const Span& b) { return a.start < b.start; });
    auto last = std::max_element(repetition.begin(), repetition.end(),
                                 [](const Span& a, const Span& b) { return a.end < b.end; });
    double seconds = std::chrono::duration<double>(last->end - first->start).count();
    rates.push_back(bytes / seconds / 1e9);
  }
  std::sort(rates.begin(), rates.end());
  if (copiers == 1) {
    printf("memcpy %zu bytes x %d: best %.2f GB/s, median %.2f GB/s (check %d)\n", bytes, repetitions, rates.back(),
           rates[rates.size() / 2], checks[0]);
  } else {
    printf("memcpy %zu bytes x %d, %d concurrent copiers: per copier best %.2f GB/s, median %.2f GB/s (check %d)\n",
           bytes, repetitions, copiers, rates.back(), rates[rates.size() / 2], checks[0]);
  }
  return 0;
}
