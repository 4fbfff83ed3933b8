#pragma once
// The CUDA backend: mom::cuda::Backend<T> (float, double) over device memory. Link mom::cuda
// (CMake target, built when nvcc is found: MOM_CUDA=AUTO/ON). This header is host C++.
#include "mom/backend/cuda/backend.hpp"
#include "mom/backend/cuda/buffer.hpp"
#include "mom/backend/cuda/check.hpp"
#include "mom/backend/cuda/kernels.hpp"
