#pragma once
// Deprecated: the GRU executor (Executor<GRU, A, D>, phi::MoM / phi::MoMRoutedKV) is assembly/gru.hpp, named
// after its router as the other executors are (assembly/sequential.hpp, share.hpp, recursion.hpp, depth.hpp).
// This forwarding header keeps old includes compiling for one release and will then be removed; include
// mom/assembly/gru.hpp (or the umbrella mom/mom.hpp) instead.
#include "mom/assembly/gru.hpp"
