// The compiled part of the CUDA backend: every kernel of kernels.cuh, instantiated for float and
// double. CMake builds it into mom::cuda; a project that uses the installed headers without CMake
// compiles this one file with nvcc (-std=c++20) and links it with cudart, cublas and cublasLt.
#include "mom/backend/cuda/kernels.cuh"
#include "mom/backend/cuda/depth_kernels.cuh"
#include "mom/backend/cuda/grouped_kernels.cuh"
#include "mom/backend/cuda/attention_tc.cuh"

namespace mom::cuda {
template struct Kernels<float>;
template struct Kernels<double>;
template struct DepthKernels<float>;
template struct DepthKernels<double>;
template struct GroupedKernels<float>;
template struct GroupedKernels<double>;
template void fill<float>(const Context&, float*, index_t, float);
template void fill<double>(const Context&, double*, index_t, double);
template void fill<token_t>(const Context&, token_t*, index_t, token_t);
}  // namespace mom::cuda
