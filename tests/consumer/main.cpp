// A downstream project: find_package(mom), link mom::mom, call an op. Built with plain -O2 and no ISA
// flags (tests/consumer/CMakeLists.txt), it still gets mom's own AVX-512 / AVX2 GEMM kernel, chosen at
// run time from the CPU (backend/cpu/gemm_native.hpp); it checks that, and the product. The backend's ops
// on float are compiled in backend_float.cpp and declared extern here (README.md, "Use it in your project").
#include <cstdio>
#include <cstring>
#include <vector>

#include <mom/backend/cpu/backend.hpp>

extern template struct mom::cpu::Backend<float>;

int main() {
  std::vector<float> a{1, 2, 3, 4}, b{1, 0, 0, 1}, c(4);
  mom::cpu::gemm<float>({c.data(), 2, 2}, {a.data(), 2, 2}, mom::cpu::Trans::N, {b.data(), 2, 2}, mom::cpu::Trans::N);
  if (c != a) return 1;
  // The same product through the backend object, whose ops this unit does not compile.
  std::vector<float> d(4);
  mom::cpu::Backend<float>{}.gemm({d.data(), 2, 2}, {a.data(), 2, 2}, mom::cpu::Trans::N, {b.data(), 2, 2},
                                  mom::cpu::Trans::N);
  if (d != a) return 1;
  // The kernel this CPU should get, whatever this program's flags.
  __builtin_cpu_init();
  const bool avx2 = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
  const char* expected = __builtin_cpu_supports("avx512f") && avx2 ? "avx512" : avx2 ? "avx2" : "eigen";
#if defined(__AVX2__) || defined(__AVX512F__)
  std::puts("consumer: built with ISA flags, the test wants plain -O2");
  return 1;
#endif
  std::printf("consumer: gemm kernel %s (expected %s)\n", mom::cpu::gemm_kernel(), expected);
  if (std::strcmp(mom::cpu::gemm_kernel(), expected) != 0) return 1;
  std::puts("consumer ok");
  return 0;
}
