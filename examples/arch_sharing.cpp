// mom-train's registry entries for parameter sharing (issue 6).
#include "train_model.hpp"

namespace mom::examples {

std::vector<ArchEntry> sharing_architectures() {
  std::vector<ArchEntry> v;
  return v;
}

}  // namespace mom::examples
