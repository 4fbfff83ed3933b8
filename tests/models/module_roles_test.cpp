// Misplaced modules are refused before anything trains: a module that declares its single_role is checked by
// MHA<N, Impl> / FFN<N, Impl> at compile time (tests/compile_fail/ffn_as_attention.cpp, attention_as_ffn.cpp);
// one that declares none and names its tensors like a neighbour's is refused by LM::make, not at the first save.
#include <catch2/catch.hpp>

#include <string>

#include "mom/mom.hpp"

using namespace mom;

namespace {
constexpr Dims tiny{.d_model = 8, .heads = 2, .d_ff = 12, .vocab = 11, .context = 6};

// GPT-2's feed-forward module as a user might copy it: without a single_role.
template <Dims D>
struct RolelessFfn : modules::FeedForward<D> {
  static constexpr int single_role = 0;  // hides the base's ModuleRole: declares none
};
static_assert(!DeclaresSingleRole<RolelessFfn<tiny>> && DeclaresSingleRole<modules::FeedForward<tiny>>);
using FfnAsAttention = Assembly<Router<Sequential>, ModuleSet<MHA<1, RolelessFfn>, FFN<1>>, K<1>, H<1>>;
}  // namespace

TEST_CASE("LM::make refuses a model whose modules name a tensor twice", "[contracts]") {
  using Bad = LM<tiny, FfnAsAttention>;
  CHECK_THROWS_WITH(Bad::make<cpu::Backend<float>>(1), Catch::Contains("mom::LM::make: two tensors of this model are named 'h.0.ln_2.b'"));
  CHECK(first_duplicate_name(LM<tiny, FfnAsAttention>::layout) == "h.0.ln_2.b");
  CHECK(first_duplicate_name(LM<tiny, Dense<2>>::layout).empty());
  using Good = LM<tiny, Dense<2>>;
  CHECK_NOTHROW(Good::make<cpu::Backend<float>>(1));
}
