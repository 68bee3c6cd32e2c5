// What the fuzz targets share: a check that stops the run with a message (libFuzzer then saves the input), and the
// parser's verdict printed when LOOM_FUZZ_VERBOSE is set (to see what a corpus file exercises).
#pragma once

#include <cstdio>
#include <cstdlib>
#include <string>

namespace loomfuzz {

[[noreturn]] inline void failed(const char* what, const char* file, int line) {
  std::fprintf(stderr, "%s:%d: fuzz check failed: %s\n", file, line, what);
  std::abort();
}

inline void verdict(const std::string& error) {
  if (std::getenv("LOOM_FUZZ_VERBOSE") != nullptr)
    std::fprintf(stderr, "%s\n", error.empty() ? "parsed" : error.c_str());
}

}  // namespace loomfuzz

#define FUZZ_CHECK(condition) ((condition) ? (void)0 : loomfuzz::failed(#condition, __FILE__, __LINE__))
