// InlineVector<T, N>: a vector of trivially copyable T that holds up to N elements without allocating. A call's
// buffer list has one entry except in Send/Recv groups, and a small call must not pay for a heap allocation.
#pragma once

#include <algorithm>
#include <cstddef>
#include <initializer_list>
#include <type_traits>
#include <vector>

namespace loom {

template <typename T, size_t N>
class InlineVector {
  static_assert(std::is_trivially_copyable_v<T>, "InlineVector holds plain values");

 public:
  InlineVector() = default;
  InlineVector(std::initializer_list<T> values) {
    for (const T& value : values) push_back(value);
  }
  InlineVector(const InlineVector&) = default;
  InlineVector& operator=(const InlineVector&) = default;
  // A moved-from vector is empty (its heap elements went with the move).
  InlineVector(InlineVector&& other) noexcept : size_(other.size_), heap_(std::move(other.heap_)) {
    std::copy(other.inline_, other.inline_ + N, inline_);
    other.size_ = 0;
  }
  InlineVector& operator=(InlineVector&& other) noexcept {
    if (this == &other) return *this;
    size_ = other.size_;
    std::copy(other.inline_, other.inline_ + N, inline_);
    heap_ = std::move(other.heap_);
    other.size_ = 0;
    other.heap_.clear();
    return *this;
  }

  void push_back(const T& value) {
    if (size_ < N) {
      inline_[size_] = value;
    } else {
      if (size_ == N) heap_.assign(inline_, inline_ + N);
      heap_.push_back(value);
    }
    ++size_;
  }

  size_t size() const { return size_; }
  bool empty() const { return size_ == 0; }
  T* data() { return size_ > N ? heap_.data() : inline_; }
  const T* data() const { return size_ > N ? heap_.data() : inline_; }
  T* begin() { return data(); }
  T* end() { return data() + size_; }
  const T* begin() const { return data(); }
  const T* end() const { return data() + size_; }
  T& operator[](size_t i) { return data()[i]; }
  const T& operator[](size_t i) const { return data()[i]; }
  T& front() { return data()[0]; }
  const T& front() const { return data()[0]; }

 private:
  size_t size_ = 0;
  T inline_[N] = {};
  std::vector<T> heap_;  // all elements once there are more than N
};

}  // namespace loom
