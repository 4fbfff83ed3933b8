// mom-train's CPU ops on float, compiled once here for every unit that includes backend_cpu.hpp (which declares
// them extern): the explicit instantiation of mom::cpu::Backend<float> (mom/backend/cpu/backend_impl.hpp).
#include "backend_cpu.hpp"

template struct mom::cpu::Backend<float>;
