// The CUDA backend's kernels (the same source nvcc compiles into mom::cuda), compiled by the host
// compiler with MOM_CUDA_EMULATE: each launch runs on CPU threads (mom/backend/cuda/emulate.hpp).
#define MOM_CUDA_EMULATE 1
#include "mom/backend/cuda/mom_cuda.cu"
