// mom-train on the CPU backend (--device cpu, the default): how it is opened and described. Included by the
// generated arch_<family>_cpu.cpp units before train_model.hpp (see architectures.hpp, "The registry").
#pragma once
#include <mom/backend/cpu.hpp>
#include <mom/train/distributed.hpp>

#include <omp.h>
#include <unistd.h>

#include <memory>
#include <string>

#include "architectures.hpp"

// The CPU backend's ops on float are compiled once, in cpu_ops.cpp, not again in each unit that trains on the CPU
// (mom/backend/cpu/backend_impl.hpp).
extern template struct mom::cpu::Backend<float>;

namespace mom::examples {

inline cpu::Backend<float> open_backend(BackendTag<cpu::Backend<float>>, const Device& d, const train::Communicator*) {
  MOM_CHECK(d.kind == DeviceKind::cpu, "internal: the CPU backend opened for --device ", d.name());
  return {};
}
inline std::string device_name(BackendTag<cpu::Backend<float>>, const cpu::Backend<float>&) { return "cpu"; }
inline std::string backend_summary(BackendTag<cpu::Backend<float>>, const cpu::Backend<float>&) {
  return "cpu (" + std::to_string(omp_get_max_threads()) + " threads), fp32";
}
inline double backend_memory_bytes(BackendTag<cpu::Backend<float>>, const cpu::Backend<float>&) {
  return double(::sysconf(_SC_PHYS_PAGES)) * double(::sysconf(_SC_PAGE_SIZE));
}

// The CPU backend's buffers are host memory: the host communicator reduces them in place.
inline std::unique_ptr<train::Communicator> device_communicator(BackendTag<cpu::Backend<float>>,
                                                                const cpu::Backend<float>&, train::Communicator*) {
  return nullptr;
}

}  // namespace mom::examples
