// The CUDA backend's kernels on float (mom_cuda.cu, the source nvcc compiles into mom::cuda_float), compiled
// by the host compiler with MOM_CUDA_EMULATE: each launch runs on CPU threads (mom/backend/cuda/emulate.hpp).
// emu_kernels_double.cpp does the same for double.
#define MOM_CUDA_EMULATE 1
#include "mom/backend/cuda/mom_cuda.cu"
