// The CUDA backend's kernels on double (mom_cuda_double.cu, the second unit of mom::cuda), compiled by the host
// compiler with MOM_CUDA_EMULATE as emu_kernels.cpp compiles the float unit: two units, built in parallel.
#define MOM_CUDA_EMULATE 1
#include "mom/backend/cuda/mom_cuda_double.cu"
