#pragma once
// Expert-choice routing (Zhou et al. 2022, arXiv 2202.09368 §3.1): every expert takes its top-c tokens of the
// batch by the token-to-expert score, so a token gets 0 .. E experts and every expert exactly c tokens.
//
// Conventions as everywhere in mom::cpu: forward ops write their outputs, backward ops accumulate (+=).
#include <algorithm>
#include <span>

#include "mom/backend/cpu/parallel.hpp"
#include "mom/backend/shape_checks.hpp"
#include "mom/core/check.hpp"
#include "mom/core/tensor.hpp"

namespace mom::cpu {

namespace detail {
struct ExpertChoiceScratch {};
}  // namespace detail

// probs [n × E]: the scores S = softmax(X W_g) (eq. (1)). Expert e takes the `capacity` rows of largest S[:, e]
// (ties to the lower row); slot e of row r is then picks[r, e] = e with weights[r, e] = S[r, e], and otherwise
// the no-op class E with weight 0 (the ExpertGate convention for "fewer experts than slots": routers/gate.hpp).
template <class T>
void expert_choice_forward(MatrixView<T> weights, MatrixView<token_t> picks, MatrixView<const T> probs, index_t capacity) {
  const index_t n = probs.rows, E = probs.cols;
  MOM_CHECK(weights.rows == n && weights.cols == E && picks.rows == n && picks.cols == E,
            "expert_choice_forward: weights ", shape(weights), ", picks ", shape(picks), " disagree with probs ",
            shape(probs), " (one slot per expert)");
  MOM_CHECK(capacity >= 0 && capacity <= n, "expert_choice_forward: capacity ", capacity, " must be in [0, ", n,
            "] (the rows)");
  for (index_t r = 0; r < n; ++r)
    for (index_t e = 0; e < E; ++e) picks(r, e) = token_t(E), weights(r, e) = T(0);
#pragma omp parallel for schedule(static) if (n * E > (1 << 14))
  for (index_t e = 0; e < E; ++e) {
    token_t* order = detail::thread_scratch<token_t, detail::ExpertChoiceScratch, 0>(std::size_t(n));
    for (index_t r = 0; r < n; ++r) order[r] = token_t(r);
    const auto before = [&](token_t a, token_t b) {  // larger score first, the lower row on a tie
      return probs(a, e) > probs(b, e) || (probs(a, e) == probs(b, e) && a < b);
    };
    std::nth_element(order, order + capacity, order + n, before);
    for (index_t i = 0; i < capacity; ++i) {
      const index_t r = order[i];
      picks(r, e) = token_t(e);
      weights(r, e) = probs(r, e);
    }
  }
}

// Backward of expert_choice_forward: dprobs[r, e] += dweights[r, e] where expert e took row r.
template <class T>
void expert_choice_backward(MatrixView<T> dprobs, MatrixView<const T> dweights, MatrixView<const token_t> picks) {
  MOM_CHECK(dprobs.rows == picks.rows && dprobs.cols == picks.cols && dweights.rows == picks.rows &&
                dweights.cols == picks.cols,
            "expert_choice_backward: dprobs ", shape(dprobs), ", dweights ", shape(dweights), " disagree with picks ",
            shape(picks));
  const index_t E = picks.cols;
  for (index_t r = 0; r < picks.rows; ++r)
    for (index_t e = 0; e < E; ++e)
      if (picks(r, e) == e) dprobs(r, e) += dweights(r, e);
}

}  // namespace mom::cpu
