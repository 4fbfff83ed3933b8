#pragma once
// SKIP, the special module m^S : x -> x (paper eq. (1)). Choosing it means a token gets no
// update in that round; it has no parameters and costs nothing.
#include "mom/modules/module.hpp"

namespace mom {

struct Skip {
  static constexpr ModuleRole role = ModuleRole::Skip;
  static constexpr int count = 1;
};

}  // namespace mom
