#pragma once
// The bf16 copies of a model's weights under Precision::BF16 (backend_concept.hpp, KeepsWeightCopies). Between
// begin_weight_copies(block) and end_weight_copies() nothing writes the block (train::Trainer opens the window around a
// step's micro-batches: the parameters change only in AdamW, after it). Inside the window a product's bf16 operand that
// lies in the block is converted the first time a product reads it, into a copy of its own, and every later product
// reads that copy: a weight's forward product and its dx product, over every micro-batch of the step, convert it once
// (ops.hpp, DenseOps::stage). Outside a window every operand is staged into the staging buffer as before.
//
// A copy is keyed by its source view and its staged shape (the LM head's weight is staged with zero rows below it to the
// padded vocabulary: a shape of its own). Its device buffer is allocated the first time a window reads it and kept for
// the windows after (freed with the context), so a training step after the first allocates nothing; opening a window
// marks every copy stale. Host C++: no nvcc needed.
#include <cstddef>
#include <cstdint>
#include <vector>

#include <cuda_runtime_api.h>

#include "mom/backend/cuda/check.hpp"
#include "mom/core/tensor.hpp"

namespace mom::cuda::detail {

struct WeightCopy {
  MatrixView<const float> src;
  index_t rows = 0, cols = 0, ld = 0;  // the staged shape (DenseOps::stage's: zeros outside src)
  std::uint16_t* data = nullptr;       // device [rows × ld], bf16 bits
  bool fresh = false;                  // converted since the window opened
};

struct WeightCopies {
  const float* begin = nullptr;  // the open window's block [begin, end); begin == end: no window open
  const float* end = nullptr;
  std::vector<WeightCopy> copies;
  index_t conversions = 0;       // copies converted so far (tests)

  WeightCopies() = default;
  WeightCopies(const WeightCopies&) = delete;
  WeightCopies& operator=(const WeightCopies&) = delete;
  ~WeightCopies() {
    for (const WeightCopy& c : copies) (void)cudaFree(c.data);
  }

  void open(const float* b, std::size_t n) {
    begin = b;
    end = b + n;
    for (WeightCopy& c : copies) c.fresh = false;
  }
  void close() { begin = end = nullptr; }
  // Whether every element of v lies in the open window's block.
  bool holds(MatrixView<const float> v) const {
    if (begin == end || v.rows == 0 || v.cols == 0) return false;
    return v.data >= begin && v.data + (v.rows - 1) * v.ld + v.cols <= end;
  }
  // The copy of v in the staged shape rows × cols, ld apart, made (allocated, not yet converted) on first use; null where
  // v does not lie in the open window's block.
  WeightCopy* find(MatrixView<const float> v, index_t rows, index_t cols, index_t ld) {
    if (!holds(v)) return nullptr;
    for (WeightCopy& c : copies)
      if (c.src.data == v.data && c.src.rows == v.rows && c.src.cols == v.cols && c.src.ld == v.ld && c.rows == rows &&
          c.cols == cols && c.ld == ld)
        return &c;
    WeightCopy c{v, rows, cols, ld};
    MOM_CUDA_CHECK(cudaMalloc(reinterpret_cast<void**>(&c.data), std::size_t(rows) * std::size_t(ld) * 2),
                   "weight copy");
    copies.push_back(c);
    return &copies.back();
  }
};

}  // namespace mom::cuda::detail
