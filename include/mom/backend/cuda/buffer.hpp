#pragma once
// The CUDA backend's owning arrays, zero-initialised, move-only, released on destruction:
//   mom::cuda::Buffer<U>        device memory (cudaMalloc). Same interface as cpu::Buffer minus element access
//                               (the host cannot dereference device pointers; use Backend::to_host / read).
//   mom::cuda::PinnedBuffer<U>  page-locked host memory (cudaMallocHost): the host reads and writes it; copies
//                               between it and device memory are DMA transfers that cudaMemcpyAsync starts without
//                               holding the host (pageable memory is first copied by the driver).
#include <cstddef>
#include <cstring>
#include <span>
#include <utility>

#include "mom/backend/cuda/check.hpp"
#include "mom/core/tensor.hpp"

namespace mom::cuda {

namespace detail {
// The pointer and size of an array from Memory::allocate(bytes), freed by Memory::release(p): the move-only
// ownership both arrays share.
template <class U, class Memory>
class OwnedArray {
 public:
  OwnedArray() = default;
  explicit OwnedArray(index_t n, const char* what) : size_(n) {
    MOM_CHECK(n >= 0, what, ": negative size ", n);
    if (n > 0) data_ = static_cast<U*>(Memory::allocate(static_cast<std::size_t>(n) * sizeof(U), what));
  }
  OwnedArray(OwnedArray&& o) noexcept : data_(std::exchange(o.data_, nullptr)), size_(std::exchange(o.size_, 0)) {}
  OwnedArray& operator=(OwnedArray&& o) noexcept {
    if (this != &o) {
      release();
      data_ = std::exchange(o.data_, nullptr);
      size_ = std::exchange(o.size_, 0);
    }
    return *this;
  }
  OwnedArray(const OwnedArray&) = delete;
  OwnedArray& operator=(const OwnedArray&) = delete;
  ~OwnedArray() { release(); }

  U* data() { return data_; }
  const U* data() const { return data_; }
  index_t size() const { return size_; }
  bool empty() const { return size_ == 0; }
  std::span<U> span() { return {data_, static_cast<std::size_t>(size_)}; }
  std::span<const U> span() const { return {data_, static_cast<std::size_t>(size_)}; }

 private:
  void release() noexcept {
    if (data_) Memory::release(data_);  // a destructor cannot throw; a failed free leaks
    data_ = nullptr;
    size_ = 0;
  }
  U* data_ = nullptr;
  index_t size_ = 0;
};

struct DeviceMemory {
  static void* allocate(std::size_t bytes, const char* what) {
    void* p = nullptr;
    MOM_CUDA_CHECK(cudaMalloc(&p, bytes), what);
    // On the legacy default stream, which the backend's (blocking) stream waits for.
    MOM_CUDA_CHECK(cudaMemset(p, 0, bytes), what);
    return p;
  }
  static void release(void* p) noexcept { (void)cudaFree(p); }
};

struct PinnedHostMemory {
  static void* allocate(std::size_t bytes, const char* what) {
    void* p = nullptr;
    MOM_CUDA_CHECK(cudaMallocHost(&p, bytes), what);
    std::memset(p, 0, bytes);
    return p;
  }
  static void release(void* p) noexcept { (void)cudaFreeHost(p); }
};
}  // namespace detail

template <class U>
class Buffer : public detail::OwnedArray<U, detail::DeviceMemory> {
 public:
  Buffer() = default;
  explicit Buffer(index_t n) : detail::OwnedArray<U, detail::DeviceMemory>(n, "Buffer") {}

  operator std::span<U>() { return this->span(); }
  operator std::span<const U>() const { return this->span(); }
  MatrixView<U> view(index_t rows, index_t cols) {
    MOM_CHECK(rows >= 0 && cols >= 0 && rows * cols <= this->size(), "Buffer::view: [", rows, "x", cols, "] exceeds ",
              this->size(), " elements");
    return {this->data(), rows, cols};
  }
  MatrixView<const U> view(index_t rows, index_t cols) const { return const_cast<Buffer*>(this)->view(rows, cols); }
};

template <class U>
class PinnedBuffer : public detail::OwnedArray<U, detail::PinnedHostMemory> {
 public:
  PinnedBuffer() = default;
  explicit PinnedBuffer(index_t n) : detail::OwnedArray<U, detail::PinnedHostMemory>(n, "PinnedBuffer") {}

  U& operator[](index_t i) { return this->data()[i]; }
  const U& operator[](index_t i) const { return this->data()[i]; }
};

}  // namespace mom::cuda
