// A downstream project: find_package(mom), link mom::mom, call an op.
#include <cstdio>
#include <vector>

#include <mom/backend/cpu/gemm.hpp>

int main() {
  std::vector<float> a{1, 2, 3, 4}, b{1, 0, 0, 1}, c(4);
  mom::cpu::gemm<float>({c.data(), 2, 2}, {a.data(), 2, 2}, mom::cpu::Trans::N, {b.data(), 2, 2}, mom::cpu::Trans::N);
  if (c != a) return 1;
  std::puts("consumer ok");
  return 0;
}
