#pragma once
// mom::cuda::Buffer<U>: an owning array in device memory (cudaMalloc), zero-initialised,
// move-only, released on destruction. Same interface as cpu::Buffer minus element access
// (the host cannot dereference device pointers; use Backend::to_host / read).
#include <cstddef>
#include <span>
#include <utility>

#include "mom/backend/cuda/check.hpp"
#include "mom/core/tensor.hpp"

namespace mom::cuda {

template <class U>
class Buffer {
 public:
  Buffer() = default;
  explicit Buffer(index_t n) : size_(n) {
    MOM_CHECK(n >= 0, "Buffer: negative size ", n);
    if (n == 0) return;
    const std::size_t bytes = static_cast<std::size_t>(n) * sizeof(U);
    void* p = nullptr;
    MOM_CUDA_CHECK(cudaMalloc(&p, bytes), "Buffer");
    data_ = static_cast<U*>(p);
    // On the legacy default stream, which the backend's (blocking) stream waits for.
    MOM_CUDA_CHECK(cudaMemset(p, 0, bytes), "Buffer");
  }
  Buffer(Buffer&& o) noexcept : data_(std::exchange(o.data_, nullptr)), size_(std::exchange(o.size_, 0)) {}
  Buffer& operator=(Buffer&& o) noexcept {
    if (this != &o) {
      release();
      data_ = std::exchange(o.data_, nullptr);
      size_ = std::exchange(o.size_, 0);
    }
    return *this;
  }
  Buffer(const Buffer&) = delete;
  Buffer& operator=(const Buffer&) = delete;
  ~Buffer() { release(); }

  U* data() { return data_; }
  const U* data() const { return data_; }
  index_t size() const { return size_; }
  bool empty() const { return size_ == 0; }

  std::span<U> span() { return {data_, static_cast<std::size_t>(size_)}; }
  std::span<const U> span() const { return {data_, static_cast<std::size_t>(size_)}; }
  operator std::span<U>() { return span(); }
  operator std::span<const U>() const { return span(); }
  MatrixView<U> view(index_t rows, index_t cols) {
    MOM_CHECK(rows >= 0 && cols >= 0 && rows * cols <= size_, "Buffer::view: [", rows, "x", cols, "] exceeds ", size_,
              " elements");
    return {data_, rows, cols};
  }
  MatrixView<const U> view(index_t rows, index_t cols) const { return const_cast<Buffer*>(this)->view(rows, cols); }

 private:
  void release() noexcept {
    if (data_) (void)cudaFree(data_);  // a destructor cannot throw; a failed free leaks
    data_ = nullptr;
    size_ = 0;
  }
  U* data_ = nullptr;
  index_t size_ = 0;
};

// mom::cuda::PinnedBuffer<U>: an owning array in page-locked host memory (cudaMallocHost), zero-initialised,
// move-only. The host reads and writes it directly; copies between it and device memory are DMA transfers
// that cudaMemcpyAsync starts without waiting for the host (pageable memory is first copied by the driver).
template <class U>
class PinnedBuffer {
 public:
  PinnedBuffer() = default;
  explicit PinnedBuffer(index_t n) : size_(n) {
    MOM_CHECK(n >= 0, "PinnedBuffer: negative size ", n);
    if (n == 0) return;
    void* p = nullptr;
    MOM_CUDA_CHECK(cudaMallocHost(&p, static_cast<std::size_t>(n) * sizeof(U)), "PinnedBuffer");
    data_ = static_cast<U*>(p);
    for (index_t i = 0; i < n; ++i) data_[i] = U{};
  }
  PinnedBuffer(PinnedBuffer&& o) noexcept : data_(std::exchange(o.data_, nullptr)), size_(std::exchange(o.size_, 0)) {}
  PinnedBuffer& operator=(PinnedBuffer&& o) noexcept {
    if (this != &o) {
      release();
      data_ = std::exchange(o.data_, nullptr);
      size_ = std::exchange(o.size_, 0);
    }
    return *this;
  }
  PinnedBuffer(const PinnedBuffer&) = delete;
  PinnedBuffer& operator=(const PinnedBuffer&) = delete;
  ~PinnedBuffer() { release(); }

  U* data() { return data_; }
  const U* data() const { return data_; }
  index_t size() const { return size_; }
  bool empty() const { return size_ == 0; }
  U& operator[](index_t i) { return data_[i]; }
  const U& operator[](index_t i) const { return data_[i]; }
  std::span<U> span() { return {data_, static_cast<std::size_t>(size_)}; }
  std::span<const U> span() const { return {data_, static_cast<std::size_t>(size_)}; }

 private:
  void release() noexcept {
    if (data_) (void)cudaFreeHost(data_);
    data_ = nullptr;
    size_ = 0;
  }
  U* data_ = nullptr;
  index_t size_ = 0;
};

}  // namespace mom::cuda
