// The compiled part of the CUDA backend on float: every kernel of kernels/ (kernels/all.cuh) instantiated for
// float, what training and decoding use (cuda::Backend<float>). mom_cuda_double.cu instantiates the same kernels
// for double (the gradient checks in double and the cross-backend tests): a separate unit, so that a program on
// float (mom-train) compiles and links this one alone and the two compile in parallel. CMake builds this unit into
// mom::cuda_float and both into mom::cuda; a project that uses the installed headers without CMake compiles one or
// both with nvcc (-std=c++20) and links them with cudart, cublas and cublasLt (docs/cuda.md). The host-side
// declarations are kernels.hpp (Kernels<T>, Context), depth_kernels.hpp and grouped_kernels.hpp.
// The non-template definitions (the bf16 staging, the dispatch's launchers on token ids, and the kernels only they
// launch) are compiled here alone: the double unit would define them a second time.
#define MOM_CUDA_FLOAT_UNIT 1
#include "mom/backend/cuda/kernels/all.cuh"

namespace mom::cuda {
template struct Kernels<float>;
template struct DepthKernels<float>;
template struct GroupedKernels<float>;
template void fill<float>(const Context&, float*, index_t, float);
template void fill<token_t>(const Context&, token_t*, index_t, token_t);
}  // namespace mom::cuda
