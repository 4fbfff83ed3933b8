#pragma once
// cuBLASLt for the GEMMs with a fused epilogue (ops.hpp): the linear forward's bias, CUBLASLT_EPILOGUE_BIAS, which
// adds a vector to every column of the column-major result, i.e. to every row of mom's row-major y, inside the GEMM
// (no broadcast kernel before it, no beta = 1 read of y); the FFN's GELU (backend_concept.hpp, FusesGelu):
// CUBLASLT_EPILOGUE_GELU_AUX_BIAS (D = gelu(A·B + bias), the pre-activation stored to the epilogue's aux matrix) and
// CUBLASLT_EPILOGUE_DGELU (D = A·B ∘ gelu'(aux)), aux laid out as D (column-major, its own leading dimension). D is
// fp32, or bf16 for the MLP's activations under BF16 (mlp_ops.hpp; then the bias and aux are bf16 too). An fp32 D may
// also take a residual C, D = A·B + bias + C (beta = 1, C laid out as D): the output linears' residual add
// (backend_concept.hpp, the pairs' `residual`).
//
// A plan per distinct product (shape, leading dimensions, types, the operands' alignment): the operation and
// layout descriptors and the heuristic's first algorithm, made the first time the product runs (host work only;
// no device allocation, the workspace is the context's) and kept by the context. A product cuBLASLt has no
// algorithm for, or whose call it refuses, is remembered as such and the caller takes its cuBLAS path instead:
// the epilogue is an optimisation, never a requirement. Host C++ (cublasLt.h): no nvcc needed.
#include <cublasLt.h>

#include <compare>
#include <cstddef>
#include <cstdint>
#include <map>
#include <vector>

#include "mom/backend/cuda/check.hpp"
#include "mom/backend/cuda/kernels.hpp"

namespace mom::cuda::detail {

// One product in cuBLAS's column-major terms: D [m × n] = alpha·op(A)·op(B) + epilogue, D = C.
struct LtProduct {
  int m = 0, n = 0, k = 0;
  cublasOperation_t ta = CUBLAS_OP_N, tb = CUBLAS_OP_N;
  int lda = 0, ldb = 0, ldd = 0;
  cudaDataType_t ab_type = CUDA_R_32F;  // A and B (CUDA_R_16BF: the staged bf16 operands)
  cudaDataType_t d_type = CUDA_R_32F;   // D, and with it the bias and the GELU epilogues' aux (cuBLASLt's rule);
                                        // CUDA_R_16BF only with bf16 A and B (mlp_ops.hpp)
  cublasComputeType_t compute = CUBLAS_COMPUTE_32F;
  cublasLtEpilogue_t epilogue = CUBLASLT_EPILOGUE_DEFAULT;
  int ld_aux = 0;                                                            // the GELU epilogues' aux (D's type)
  int align_a = 0, align_b = 0, align_c = 0, align_d = 0, align_bias = 0, align_aux = 0;  // bytes (powers of two to 256)
  auto operator<=>(const LtProduct&) const = default;
};

struct LtPlan {
  bool ok = false;  // false: no algorithm (or a refused call): the caller's cuBLAS path runs it
  cublasLtMatmulDesc_t op = nullptr;
  cublasLtMatrixLayout_t a = nullptr, b = nullptr, d = nullptr;
  cublasLtMatmulAlgo_t algo{};
};

struct LtPlans {
  std::map<LtProduct, LtPlan> plans;
  // The buffers a fused op pair's forward last wrote in its bf16 layout, by address (norm_ops.hpp, mlp_ops.hpp: a
  // LayerNorm's output, an MLP's activations): the pair's backward reads those so. One entry per buffer of a model,
  // added on its first bf16 forward.
  std::vector<const void*> bf16_layout;
  // The qkv norm_linear_forward last wrote in bf16, until the attention pair's forward takes it (norm_ops.hpp).
  const void* bf16_qkv = nullptr;
  LtPlans() = default;
  LtPlans(const LtPlans&) = delete;
  LtPlans& operator=(const LtPlans&) = delete;
  ~LtPlans() {
    for (auto& [key, p] : plans) {
      if (p.op) (void)cublasLtMatmulDescDestroy(p.op);
      for (cublasLtMatrixLayout_t l : {p.a, p.b, p.d})
        if (l) (void)cublasLtMatrixLayoutDestroy(l);
    }
  }
};

// The largest power of two up to 256 that divides the address.
inline int lt_alignment(const void* p) {
  const auto v = reinterpret_cast<std::uintptr_t>(p);
  int a = 1;
  while (a < 256 && v % std::uintptr_t(2 * a) == 0) a *= 2;
  return a;
}

inline LtPlan make_lt_plan(const Context& ctx, const LtProduct& g, const void* aux) {
  LtPlan p;
  const auto ok = [](cublasStatus_t s) { return s == CUBLAS_STATUS_SUCCESS; };
  if (!ok(cublasLtMatmulDescCreate(&p.op, g.compute, CUDA_R_32F))) return p;
  const cudaDataType_t bias_type = g.d_type;
  bool set = ok(cublasLtMatmulDescSetAttribute(p.op, CUBLASLT_MATMUL_DESC_TRANSA, &g.ta, sizeof g.ta)) &&
             ok(cublasLtMatmulDescSetAttribute(p.op, CUBLASLT_MATMUL_DESC_TRANSB, &g.tb, sizeof g.tb)) &&
             ok(cublasLtMatmulDescSetAttribute(p.op, CUBLASLT_MATMUL_DESC_EPILOGUE, &g.epilogue, sizeof g.epilogue)) &&
             ok(cublasLtMatmulDescSetAttribute(p.op, CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE, &bias_type, sizeof bias_type));
  if (set && g.ld_aux > 0) {  // the heuristic reads the aux pointer's alignment (cublasLt.h)
    const std::int64_t ld_aux = g.ld_aux;
    set = ok(cublasLtMatmulDescSetAttribute(p.op, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_LD, &ld_aux, sizeof ld_aux)) &&
          ok(cublasLtMatmulDescSetAttribute(p.op, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_POINTER, &aux, sizeof aux));
  }
  const bool at = g.ta != CUBLAS_OP_N, bt = g.tb != CUBLAS_OP_N;
  set = set && ok(cublasLtMatrixLayoutCreate(&p.a, g.ab_type, at ? g.k : g.m, at ? g.m : g.k, g.lda)) &&
        ok(cublasLtMatrixLayoutCreate(&p.b, g.ab_type, bt ? g.n : g.k, bt ? g.k : g.n, g.ldb)) &&
        ok(cublasLtMatrixLayoutCreate(&p.d, g.d_type, g.m, g.n, g.ldd));
  if (!set) return p;
  cublasLtMatmulPreference_t pref = nullptr;
  if (!ok(cublasLtMatmulPreferenceCreate(&pref))) return p;
  const std::size_t ws = ctx.workspace_bytes;
  const std::uint32_t align_a = std::uint32_t(g.align_a), align_b = std::uint32_t(g.align_b),
                      align_c = std::uint32_t(g.align_c), align_d = std::uint32_t(g.align_d);
  cublasLtMatmulHeuristicResult_t result{};
  int found = 0;
  const bool asked =
      ok(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws, sizeof ws)) &&
      ok(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, &align_a, sizeof align_a)) &&
      ok(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES, &align_b, sizeof align_b)) &&
      ok(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, &align_c, sizeof align_c)) &&
      ok(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES, &align_d, sizeof align_d)) &&
      ok(cublasLtMatmulAlgoGetHeuristic(ctx.lt, p.op, p.a, p.b, p.d, p.d, pref, 1, &result, &found));
  (void)cublasLtMatmulPreferenceDestroy(pref);
  if (asked && found > 0 && ok(result.state) && result.workspaceSize <= ws) {
    p.algo = result.algo;
    p.ok = true;
  }
  return p;
}

// The plan of product g over these operands (their alignment completes the key; C: a residual, D's place without one),
// made on first use; null where cuBLASLt cannot run it (remembered: the caller's cuBLAS path runs this product from now
// on).
inline LtPlan* lt_plan(Context& ctx, LtProduct g, const void* A, const void* B, const void* D, const void* bias,
                       const void* aux = nullptr, const void* C = nullptr) {
  if (!ctx.lt || !ctx.lt_plans || g.m == 0 || g.n == 0 || g.k == 0) return nullptr;
  if (g.ld_aux % 8 != 0) return nullptr;  // the GELU epilogues' aux: a leading dimension divisible by 8 (cublasLt.h)
  g.align_a = lt_alignment(A), g.align_b = lt_alignment(B), g.align_d = lt_alignment(D), g.align_bias = lt_alignment(bias);
  g.align_c = C ? lt_alignment(C) : g.align_d;
  g.align_aux = aux ? lt_alignment(aux) : 0;
  auto it = ctx.lt_plans->plans.find(g);
  if (it == ctx.lt_plans->plans.end()) it = ctx.lt_plans->plans.emplace(g, make_lt_plan(ctx, g, aux)).first;
  return it->second.ok ? &it->second : nullptr;
}

// D = alpha·op(A)·op(B) + the plan's epilogue (bias at `bias`, the GELU epilogues' aux matrix at `aux`) on the
// context's stream, plus C where given (a residual laid out as D: beta = 1). False, with nothing enqueued, where
// cuBLASLt refuses the call (its argument checks); the plan is then marked unusable.
inline bool lt_run(Context& ctx, LtPlan& p, float alpha, const void* A, const void* B, void* D, const void* bias,
                   const void* aux = nullptr, const void* C = nullptr) {
  const float beta = C ? 1.0f : 0.0f;
  if (aux && cublasLtMatmulDescSetAttribute(p.op, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_POINTER, &aux, sizeof aux) !=
                 CUBLAS_STATUS_SUCCESS)
    return p.ok = false;
  if (cublasLtMatmulDescSetAttribute(p.op, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &bias, sizeof bias) != CUBLAS_STATUS_SUCCESS ||
      cublasLtMatmul(ctx.lt, p.op, &alpha, A, p.a, B, p.b, &beta, C ? C : D, p.d, D, p.d, &p.algo, ctx.workspace,
                     ctx.workspace_bytes, ctx.stream) != CUBLAS_STATUS_SUCCESS)
    return p.ok = false;
  return true;
}

}  // namespace mom::cuda::detail
