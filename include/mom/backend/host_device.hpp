#pragma once
// MOM_HOST_DEVICE: a function both backends run, the CPU's ops and the CUDA kernels that mirror them (one body, so
// both compute the same thing in the same order): host and device code under nvcc, plain C++ everywhere else (the
// CUDA emulation included). Its users: backend/topk_insert.hpp, backend/affinity_row.hpp.
#if defined(__CUDACC__)
#define MOM_HOST_DEVICE __host__ __device__
#else
#define MOM_HOST_DEVICE
#endif
