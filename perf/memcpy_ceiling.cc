// The ceiling that shared-memory collectives are measured against: memcpy bandwidth of one thread on buffers
// far larger than the caches. Usage: memcpy_ceiling [bytes (default 256M)] [repetitions (default 10)].
// Prints the best and the median copy rate in GB/s (1e9 bytes per second, bytes copied, as nccl-tests counts).
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <vector>

int main(int argc, char** argv) {
  size_t bytes = argc > 1 ? std::strtoull(argv[1], nullptr, 0) : size_t{256} << 20;
  int repetitions = argc > 2 ? std::atoi(argv[2]) : 10;
  if (bytes == 0 || repetitions < 1) {
    std::fprintf(stderr, "usage: memcpy_ceiling [bytes > 0] [repetitions >= 1]\n");
    return 2;
  }
  std::vector<char> source(bytes, 1), target(bytes, 0);
  std::vector<double> rates;
  for (int r = 0; r < repetitions; ++r) {
    auto start = std::chrono::steady_clock::now();
    std::memcpy(target.data(), source.data(), bytes);
    double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    rates.push_back(bytes / seconds / 1e9);
  }
  std::sort(rates.begin(), rates.end());
  std::printf("memcpy %zu bytes x %d: best %.2f GB/s, median %.2f GB/s (check %d)\n", bytes, repetitions, rates.back(),
              rates[rates.size() / 2], target[bytes / 2]);
  return 0;
}
