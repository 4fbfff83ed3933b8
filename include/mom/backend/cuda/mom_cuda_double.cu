// The compiled part of the CUDA backend on double (cuda::Backend<double>: the gradient checks in double and the
// cross-backend tests): every kernel of kernels/ instantiated for double. The float instantiations are
// mom_cuda.cu's; this unit is linked beside it in mom::cuda (docs/cuda.md).
#include "mom/backend/cuda/kernels/all.cuh"

namespace mom::cuda {
template struct Kernels<double>;
template struct DepthKernels<double>;
template struct GroupedKernels<double>;
template void fill<double>(const Context&, double*, index_t, double);
}  // namespace mom::cuda
