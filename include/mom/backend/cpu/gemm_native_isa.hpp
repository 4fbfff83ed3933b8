// One instruction set's GEMM kernels (mom's own, gemm_native.hpp has the structure and the
// dispatch). No include guard: gemm_native.hpp includes this file twice, inside
// namespace native::avx512 with MOM_NATIVE_ISA 512 and inside native::avx2 with 256, each under
// `#pragma GCC target` so that it compiles whatever flags the including program uses.
#if !defined(MOM_NATIVE_ISA)
#error "gemm_native_isa.hpp is included by gemm_native.hpp only"
#endif

// ---- blocking -----------------------------------------------------------------
// AVX-512: 14×32 tile = 28 zmm accumulators + 2 for the B row + 1 broadcast A value.
// 28 independent FMA chains cover the FMA latency (4 cycles) × 2 pipes many times over;
// in L1 the kernel runs at the core's FMA peak (~215 GFLOP/s measured on one core).
// Block sizes were measured on the Zen 5 EPYC this was tuned on (48 KiB L1d, 1 MiB L2
// per core, 32 MiB L3; 2 threads, best of 8, the three linear-layer shapes at
// 4096×768×3072), not derived from cache formulas:
//  - a deep KC wins: every KC step re-reads and re-writes C, from memory at these sizes,
//    and this core's L2 feeds the kernel fast enough that the B panel (KC·NR·4 = 96 KiB)
//    need not sit in L1. KC 256 → 512 → 768: ~350 → ~385 → ~408 GFLOP/s;
//  - MC·KC·4 = the A block per thread in L2 (168·768·4 = 504 KiB);
//  - a small NC keeps the shared, double-buffered B block (KC·NC·4 = 3 MiB each) and the
//    C rows one A block writes (MC·NC) close: NC 4096 → 1024 gained ~3-5%.
// Overridable (-DMOM_GEMM_KC=...) for tuning on another machine.
#if MOM_NATIVE_ISA == 512
inline constexpr index_t MR = 14;
inline constexpr index_t NR = 32;
#ifndef MOM_GEMM_KC
#define MOM_GEMM_KC 768
#endif
#ifndef MOM_GEMM_MC
#define MOM_GEMM_MC (14 * 12)
#endif
inline constexpr index_t KC = MOM_GEMM_KC;
inline constexpr index_t MC = MOM_GEMM_MC;
#ifndef MOM_GEMM_NC
#define MOM_GEMM_NC 1024
#endif
inline constexpr index_t NC = MOM_GEMM_NC;
#else
// AVX2: 6×16 tile = 12 ymm accumulators + 2 for B + 1 broadcast.
inline constexpr index_t MR = 6;
inline constexpr index_t NR = 16;
inline constexpr index_t KC = 256;
inline constexpr index_t MC = 6 * 24;
inline constexpr index_t NC = 4096;
#endif

// Pack rows [0, mc) × k-columns [0, kc) of op(A) (already offset to the block) into
// MR-row panels: panel p holds, for each k, op(A)(p*MR + 0..MR-1, k); rows past mc are 0.
inline void pack_a_panel(float* dst, Operand a, index_t rows, index_t kc) {
  if (a.cs == 1 && !a.transposed) {
    // op(A) row-major in k (A not transposed): read each row contiguously, write strided.
    index_t i = 0;
    for (; i < rows; ++i) {
      const float* src = a.row(i);
      if (a.scale) {
        const float s = a.scale[i];
        for (index_t k = 0; k < kc; ++k) dst[k * MR + i] = src[k] * s;
      } else {
        for (index_t k = 0; k < kc; ++k) dst[k * MR + i] = src[k];
      }
    }
    for (; i < MR; ++i)
      for (index_t k = 0; k < kc; ++k) dst[k * MR + i] = 0.0f;
  } else {
    // op(A) = Aᵀ: the MR values of one k are contiguous in A (row col(k) of A, with a list).
    for (index_t k = 0; k < kc; ++k) {
      const float* src = a.col(k);
      const float s = a.scale_of(k);
      float* d = dst + k * MR;
      index_t i = 0;
      if (a.scale)
        for (; i < rows; ++i) d[i] = src[i * a.rs] * s;
      else if (a.rs == 1)
        for (; i < rows; ++i) d[i] = src[i];
      else
        for (; i < rows; ++i) d[i] = src[i * a.rs];
      for (; i < MR; ++i) d[i] = 0.0f;
    }
  }
}

// Pack k-rows [0, kc) × columns [0, cols) of op(B) into one NR-column panel.
inline void pack_b_panel(float* dst, Operand b, index_t cols, index_t kc) {
  if (b.cs == 1) {
    // op(B) row-major (B not transposed): each k row holds the NR values contiguously.
    for (index_t k = 0; k < kc; ++k) {
      const float* src = b.row(k);
      float* d = dst + k * NR;
      if (cols == NR) {
        for (index_t j = 0; j < NR; ++j) d[j] = src[j];
      } else {
        index_t j = 0;
        for (; j < cols; ++j) d[j] = src[j];
        for (; j < NR; ++j) d[j] = 0.0f;
      }
    }
  } else {
    // op(B) = Bᵀ: column j of op(B) is row j of B, contiguous in k.
    index_t j = 0;
    for (; j < cols; ++j) {
      const float* src = b.data + j * b.cs;
      if (b.rs == 1)
        for (index_t k = 0; k < kc; ++k) dst[k * NR + j] = src[k];
      else
        for (index_t k = 0; k < kc; ++k) dst[k * NR + j] = src[k * b.rs];
    }
    for (; j < NR; ++j)
      for (index_t k = 0; k < kc; ++k) dst[k * NR + j] = 0.0f;
  }
}

#if MOM_NATIVE_ISA == 512
// 16×16 in-register transpose, used to pack the transposed cases with full vectors.
inline void transpose16x16(__m512 r[16]) {
  __m512 t[16];
  for (int i = 0; i < 16; i += 2) {
    // (maskz with a full mask = the plain instruction; the unmasked intrinsics trip GCC 12's
    // uninitialised-variable warning on their undefined pass-through operand)
    t[i] = _mm512_maskz_unpacklo_ps(0xffff, r[i], r[i + 1]);
    t[i + 1] = _mm512_maskz_unpackhi_ps(0xffff, r[i], r[i + 1]);
  }
  for (int i = 0; i < 16; i += 4) {
    r[i] = _mm512_maskz_shuffle_ps(0xffff, t[i], t[i + 2], _MM_SHUFFLE(1, 0, 1, 0));
    r[i + 1] = _mm512_maskz_shuffle_ps(0xffff, t[i], t[i + 2], _MM_SHUFFLE(3, 2, 3, 2));
    r[i + 2] = _mm512_maskz_shuffle_ps(0xffff, t[i + 1], t[i + 3], _MM_SHUFFLE(1, 0, 1, 0));
    r[i + 3] = _mm512_maskz_shuffle_ps(0xffff, t[i + 1], t[i + 3], _MM_SHUFFLE(3, 2, 3, 2));
  }
  for (int i = 0; i < 4; ++i) {
    t[i] = _mm512_maskz_shuffle_f32x4(0xffff, r[i], r[i + 4], 0x88);
    t[i + 4] = _mm512_maskz_shuffle_f32x4(0xffff, r[i], r[i + 4], 0xdd);
    t[i + 8] = _mm512_maskz_shuffle_f32x4(0xffff, r[i + 8], r[i + 12], 0x88);
    t[i + 12] = _mm512_maskz_shuffle_f32x4(0xffff, r[i + 8], r[i + 12], 0xdd);
  }
  for (int i = 0; i < 8; ++i) {
    r[i] = _mm512_maskz_shuffle_f32x4(0xffff, t[i], t[i + 8], 0x88);
    r[i + 8] = _mm512_maskz_shuffle_f32x4(0xffff, t[i], t[i + 8], 0xdd);
  }
}
#endif

// ---- micro-kernels ----------------------------------------------------------------
#if MOM_NATIVE_ISA == 512
// Where a tile's values of op(A) come from: a packed panel (MR values per k), or rows of op(A) read in place (the
// few-column path below).
struct PanelA {
  const float* p;
  float operator()(int i, index_t k) const { return p[k * MR + i]; }
};
struct RowsA {
  const float* const* rows;  // R row pointers
  float operator()(int i, index_t k) const { return rows[i][k]; }
};
// op(A) = Aᵀ read in place: op(A)(i0 + i, k) = col[k][i0 + i] (col[k]: the memory row holding op(A)'s column k).
struct ColsA {
  const float* const* col;
  index_t i0;
  float operator()(int i, index_t k) const { return col[k][i0 + i]; }
};
// One tile of C, R ≤ MR rows × 16·V columns (V = 1 or 2 vectors), from R rows of op(A) and a B panel (NR values
// per k, the first 16·V read): C = alpha · (A·B) + beta · C on the tile's first `cols` columns (beta == 0: C not
// read). Every element is the same k-ordered chain of fused multiply-adds from zero whatever R, V and A's source,
// so neither changes a bit: the edge tiles of C (the last rows of an m that is not a multiple of MR, a last panel
// of at most 16 columns) run only the rows and vectors they hold instead of a full MR × NR tile (a routed
// expert's few hundred rows, a 43- or 16-column selection product).
template <int R, int V, class A>
[[gnu::always_inline]] inline void tile_kernel(index_t kc, A a, const float* __restrict b, float* c, index_t ldc,
                                               float alpha, float beta, index_t cols, bool relu) {
  __m512 acc[R][V];
#pragma GCC unroll 14
  for (int i = 0; i < R; ++i)
    for (int v = 0; v < V; ++v) acc[i][v] = _mm512_setzero_ps();
  // Pull this tile of C towards L1 while the k loop runs (it is read at the end).
#pragma GCC unroll 14
  for (int i = 0; i < R; ++i) {
    _mm_prefetch(reinterpret_cast<const char*>(c + i * ldc), _MM_HINT_T0);
    _mm_prefetch(reinterpret_cast<const char*>(c + i * ldc + cols - 1), _MM_HINT_T0);
  }
#pragma GCC unroll 2
  for (index_t k = 0; k < kc; ++k) {
    __m512 bv[V];
    for (int v = 0; v < V; ++v) bv[v] = _mm512_load_ps(b + 16 * v);
#pragma GCC unroll 14
    for (int i = 0; i < R; ++i) {
      const __m512 ai = _mm512_set1_ps(a(i, k));
      for (int v = 0; v < V; ++v) acc[i][v] = _mm512_fmadd_ps(ai, bv[v], acc[i][v]);
    }
    b += NR;
  }
  const __m512 va = _mm512_set1_ps(alpha);
  const __m512 vb = _mm512_set1_ps(beta);
  __mmask16 m[V];
  for (int v = 0; v < V; ++v) {
    const index_t left = cols - 16 * v;  // columns of this vector
    m[v] = left >= 16 ? __mmask16(0xffff) : left <= 0 ? __mmask16(0) : __mmask16((1u << left) - 1u);
  }
  const __m512 zero = _mm512_setzero_ps();
#pragma GCC unroll 14
  for (int i = 0; i < R; ++i) {
    float* ci = c + i * ldc;
    for (int v = 0; v < V; ++v) {
      __m512 r = beta == 0.0f ? _mm512_mul_ps(va, acc[i][v])
                              : _mm512_fmadd_ps(va, acc[i][v], _mm512_mul_ps(vb, _mm512_maskz_loadu_ps(m[v], ci + 16 * v)));
      if (relu) r = _mm512_max_ps(zero, r);  // std::max(r, 0): r where unordered or equal (NaN, -0 kept)
      _mm512_mask_storeu_ps(ci + 16 * v, m[v], r);
    }
  }
}
// A tile of any size up to Rmax × NR (out of line: the edges), by its rows and columns.
template <class A, int Rmax>
inline void edge_tile(index_t rows, index_t cols, index_t kc, A a, const float* b, float* c, index_t ldc, float alpha,
                      float beta, bool relu = false) {
  using Tile = void (*)(index_t, A, const float*, float*, index_t, float, float, index_t, bool);
  static constexpr auto table = []<int... I>(std::integer_sequence<int, I...>) {
    return std::array<Tile, 2 * Rmax>{&tile_kernel<I + 1, 1, A>..., &tile_kernel<I + 1, 2, A>...};  // [V - 1][R - 1]
  }(std::make_integer_sequence<int, Rmax>{});
  table[std::size_t((cols > 16 ? Rmax : 0) + rows - 1)](kc, a, b, c, ldc, alpha, beta, cols, relu);
}
// C[0:rows, 0:cols] = alpha · (Apanel · Bpanel) + beta · C (relu: then max(C, 0) before the store): the full tile
// inline, an edge tile by its size.
[[gnu::always_inline]] inline void micro_kernel(index_t kc, const float* __restrict a, const float* __restrict b,
                                                float* c, index_t ldc, float alpha, float beta, index_t rows,
                                                index_t cols, bool relu) {
  if (rows == MR && cols > 16) return tile_kernel<MR, 2>(kc, PanelA{a}, b, c, ldc, alpha, beta, cols, relu);
  edge_tile<PanelA, MR>(rows, cols, kc, PanelA{a}, b, c, ldc, alpha, beta, relu);
}
#else
[[gnu::always_inline]] inline void micro_kernel_full(index_t kc, const float* __restrict a, const float* __restrict b,
                                                     float* c, index_t ldc, float alpha, float beta, bool relu) {
  __m256 acc[MR][2];
#pragma GCC unroll 6
  for (int i = 0; i < MR; ++i) {
    acc[i][0] = _mm256_setzero_ps();
    acc[i][1] = _mm256_setzero_ps();
  }
#pragma GCC unroll 2
  for (index_t k = 0; k < kc; ++k) {
    const __m256 b0 = _mm256_load_ps(b);
    const __m256 b1 = _mm256_load_ps(b + 8);
#pragma GCC unroll 6
    for (int i = 0; i < MR; ++i) {
      const __m256 ai = _mm256_broadcast_ss(a + i);
      acc[i][0] = _mm256_fmadd_ps(ai, b0, acc[i][0]);
      acc[i][1] = _mm256_fmadd_ps(ai, b1, acc[i][1]);
    }
    a += MR;
    b += NR;
  }
  const __m256 va = _mm256_set1_ps(alpha);
  const __m256 vb = _mm256_set1_ps(beta);
  const __m256 zero = _mm256_setzero_ps();
#pragma GCC unroll 6
  for (int i = 0; i < MR; ++i) {
    float* ci = c + i * ldc;
    __m256 r0, r1;
    if (beta == 0.0f) {
      r0 = _mm256_mul_ps(va, acc[i][0]);
      r1 = _mm256_mul_ps(va, acc[i][1]);
    } else {
      r0 = _mm256_fmadd_ps(va, acc[i][0], _mm256_mul_ps(vb, _mm256_loadu_ps(ci)));
      r1 = _mm256_fmadd_ps(va, acc[i][1], _mm256_mul_ps(vb, _mm256_loadu_ps(ci + 8)));
    }
    if (relu) {  // std::max(r, 0): r where unordered or equal (NaN, -0 kept)
      r0 = _mm256_max_ps(zero, r0);
      r1 = _mm256_max_ps(zero, r1);
    }
    _mm256_storeu_ps(ci, r0);
    _mm256_storeu_ps(ci + 8, r1);
  }
}
inline void micro_kernel(index_t kc, const float* a, const float* b, float* c, index_t ldc, float alpha, float beta,
                         index_t rows, index_t cols, bool relu) {
  if (rows == MR && cols == NR) return micro_kernel_full(kc, a, b, c, ldc, alpha, beta, relu);
  // Partial tile: compute the full tile into a stack buffer, then merge the valid part.
  alignas(32) float tile[MR * NR];
  micro_kernel_full(kc, a, b, tile, NR, 1.0f, 0.0f, false);
  for (index_t i = 0; i < rows; ++i)
    for (index_t j = 0; j < cols; ++j) {
      float& cij = c[i * ldc + j];
      cij = beta == 0.0f ? alpha * tile[i * NR + j] : alpha * tile[i * NR + j] + beta * cij;
      if (relu) cij = cij < 0.0f ? 0.0f : cij;
    }
}
#endif

#if MOM_NATIVE_ISA == 512
// Vectorised packing of the two transposed layouts (16×16 register transposes); the
// scalar pack_*_panel handle the rest and the edges.
inline void pack_a_panel_fast(float* dst, Operand a, index_t rows, index_t kc) {
  // op(A) not transposed, full panel: rows are contiguous in k; transpose 16-k chunks.
  if (a.cs != 1 || a.transposed || rows != MR || kc % 16 != 0) return pack_a_panel(dst, a, rows, kc);
  for (index_t k0 = 0; k0 < kc; k0 += 16) {
    __m512 r[16];
    if (a.scale)
      for (int i = 0; i < MR; ++i) r[i] = _mm512_mul_ps(_mm512_loadu_ps(a.row(i) + k0), _mm512_set1_ps(a.scale[i]));
    else
      for (int i = 0; i < MR; ++i) r[i] = _mm512_loadu_ps(a.row(i) + k0);
    for (int i = MR; i < 16; ++i) r[i] = _mm512_setzero_ps();
    transpose16x16(r);  // r[k] = op(A)(0..15, k0 + k)
    for (int k = 0; k < 16; ++k) _mm512_mask_storeu_ps(dst + (k0 + k) * MR, __mmask16((1u << MR) - 1u), r[k]);
  }
}
inline void pack_b_panel_fast(float* dst, Operand b, index_t cols, index_t kc) {
  // op(B) = Bᵀ, full panel: column j of op(B) is contiguous in k; transpose 16×16 blocks.
  if (b.rs != 1 || b.rows || cols != NR || kc % 16 != 0) return pack_b_panel(dst, b, cols, kc);
  for (index_t k0 = 0; k0 < kc; k0 += 16) {
    for (int j0 = 0; j0 < NR; j0 += 16) {
      __m512 r[16];
      for (int j = 0; j < 16; ++j) r[j] = _mm512_loadu_ps(b.data + (j0 + j) * b.cs + k0);
      transpose16x16(r);  // r[k] = op(B)(k0 + k, j0..j0+15)
      for (int k = 0; k < 16; ++k) _mm512_store_ps(dst + (k0 + k) * NR + j0, r[k]);
    }
  }
}
#else
inline void pack_a_panel_fast(float* dst, Operand a, index_t rows, index_t kc) { pack_a_panel(dst, a, rows, kc); }
inline void pack_b_panel_fast(float* dst, Operand b, index_t cols, index_t kc) { pack_b_panel(dst, b, cols, kc); }
#endif

// ---- the blocked driver

inline void pack_b_panels(const Problem& p, float* bpack, index_t jc, index_t pc, index_t kc, index_t jp_begin,
                          index_t jp_end) {
  for (index_t jp = jp_begin; jp < jp_end; ++jp) {
    const index_t j0 = jc + jp * NR;
    pack_b_panel_fast(bpack + jp * NR * kc, p.b.from(pc, j0), std::min(NR, p.n - j0), kc);
  }
}

#ifndef MOM_PF_ROWS
#define MOM_PF_ROWS 8
#endif
inline constexpr index_t kPrefetchRows = MOM_PF_ROWS;

inline void pack_a_block(const Problem& p, float* apack, index_t ic, index_t mc, index_t pc, index_t kc) {
#if MOM_NATIVE_ISA == 512
  if (p.a.rs == 1 && (!p.a.rows || p.a.transposed)) {
    // op(A) = Aᵀ: row k of A (row col(k), with a list) holds the block's mc values contiguously. Walk A row
    // by row (one sequential read per row, each page touched once per block) and deal each row's values out
    // to the panels, instead of reading MR-wide strips panel by panel.
    const index_t panels = (mc + MR - 1) / MR;
    for (index_t k = 0; k < kc; ++k) {
      const float* src = p.a.col(pc + k) + ic;
      if (k + kPrefetchRows < kc) {  // the rows are far apart: help the hardware prefetcher
        const float* ahead = p.a.col(pc + k + kPrefetchRows) + ic;
        for (index_t j = 0; j < mc; j += 16) _mm_prefetch(reinterpret_cast<const char*>(ahead + j), _MM_HINT_T0);
      }
      const __m512 s = _mm512_set1_ps(p.a.scale_of(pc + k));
      for (index_t ip = 0; ip < panels; ++ip) {
        const index_t rows = std::min(MR, mc - ip * MR);
        const __mmask16 mask = __mmask16((1u << rows) - 1u);
        __m512 v = _mm512_maskz_loadu_ps(mask, src + ip * MR);
        if (p.a.scale) v = _mm512_mul_ps(v, s);
        _mm512_mask_storeu_ps(apack + ip * MR * kc + k * MR, __mmask16((1u << MR) - 1u), v);
      }
    }
    return;
  }
#endif
  for (index_t ip = 0; ip * MR < mc; ++ip) {
    const index_t i0 = ic + ip * MR;
    pack_a_panel_fast(apack + ip * MR * kc, p.a.from(i0, pc), std::min(MR, p.m - i0), kc);
  }
}

// Micro-tiles of one packed A block (rows ic..ic+mc) against B panels [jp_begin, jp_end):
// each B panel stays in L1 while the A panels stream from L2.
// relu: the last k block of a product with Epilogue::relu (each tile's max(C, 0) in registers, before its store).
inline void macro_kernel(const Problem& p, const float* apack, const float* bpack, index_t ic, index_t mc, index_t jc,
                         index_t kc, float beta, index_t jp_begin, index_t jp_end, bool relu) {
  for (index_t jp = jp_begin; jp < jp_end; ++jp) {
    const index_t j0 = jc + jp * NR;
    const index_t cols = std::min(NR, p.n - j0);
    for (index_t ip = 0; ip * MR < mc; ++ip) {
      const index_t i0 = ic + ip * MR, rows = std::min(MR, p.m - i0);
      micro_kernel(kc, apack + ip * MR * kc, bpack + jp * NR * kc, p.c + i0 * p.ldc + j0, p.ldc, p.alpha, beta, rows,
                   cols, relu);
    }
  }
}

// Even block sizes: k in steps of at most KC (multiples of 16 but the last, for the
// vector packing paths), m in blocks of at most MC whose MR-panel counts differ by at
// most one. Even blocks keep the threads' shares equal (and m = 1024 does not end in
// a 16-row block of 168-row ones).
inline index_t k_step(index_t k) {
  const index_t steps = (k + KC - 1) / KC;
  return std::min(KC, ((k + steps - 1) / steps + 15) / 16 * 16);
}
struct MBlocks {
  index_t panels, count;
  MBlocks(index_t m) : panels((m + MR - 1) / MR), count((panels + MC / MR - 1) / (MC / MR)) {}
  index_t begin(index_t b) const { return panels * b / count * MR; }  // first row of block b
};

// The whole product on the calling thread; no synchronisation.
inline void run_serial(const Problem& p, float* apack, float* bpack) {
  const index_t kstep = k_step(p.k);
  const MBlocks mb(p.m);
  for (index_t jc = 0; jc < p.n; jc += NC) {
    const index_t nc = std::min(NC, p.n - jc);
    const index_t b_panels = (nc + NR - 1) / NR;
    for (index_t pc = 0; pc < p.k; pc += kstep) {
      const index_t kc = std::min(kstep, p.k - pc);
      const float beta = pc == 0 ? p.beta : 1.0f;
      pack_b_panels(p, bpack, jc, pc, kc, 0, b_panels);
      for (index_t b = 0; b < mb.count; ++b) {
        const index_t ic = mb.begin(b);
        const index_t mc = std::min(p.m, mb.begin(b + 1)) - ic;
        pack_a_block(p, apack, ic, mc, pc, kc);
        macro_kernel(p, apack, bpack, ic, mc, jc, kc, beta, 0, b_panels, p.relu && pc + kc >= p.k);
      }
    }
  }
}

// The product on a team of nt threads (this is thread tid). Per (jc, pc) block the
// team packs the B block together (one barrier), then every thread takes work units
// from a shared counter: a unit is one MC block of A (packed into the thread's own
// buffer) against one share of the B panels. Taking units dynamically keeps both
// cores busy when one of them also runs something else, and there is a single
// barrier per KC step. The B block is double buffered: the barrier after packing
// block t+1 also proves that nobody still reads the buffer block t+2 overwrites.
// `next_unit` numbers units across all blocks; a ticket drawn past the current block
// is kept for the next one.
inline void run_parallel(const Problem& p, float* apack_mine, float* bpack2, std::int64_t* next_unit, int tid, int nt) {
  const index_t kstep = k_step(p.k);
  const MBlocks mb(p.m);
  const index_t m_blocks = mb.count;
  std::int64_t ticket = -1;     // drawn but not yet done
  std::int64_t first_unit = 0;  // of the current (jc, pc) block
  int parity = 0;
  for (index_t jc = 0; jc < p.n; jc += NC) {
    const index_t nc = std::min(NC, p.n - jc);
    const index_t b_panels = (nc + NR - 1) / NR;
    // Split the B panels as well when there are too few A blocks to share out.
    index_t n_split = 1;
    while (m_blocks * n_split < 4 * nt && n_split * 2 <= b_panels) n_split *= 2;
    const std::int64_t units = m_blocks * n_split;
    for (index_t pc = 0; pc < p.k; pc += kstep, parity ^= 1) {
      const index_t kc = std::min(kstep, p.k - pc);
      const float beta = pc == 0 ? p.beta : 1.0f;
      float* bpack = bpack2 + parity * (NC * KC);
      index_t begin, end;
      share(b_panels, tid, nt, begin, end);
      pack_b_panels(p, bpack, jc, pc, kc, begin, end);
#pragma omp barrier
      index_t packed_ic = -1;
      for (;;) {
        if (ticket < 0) {
#pragma omp atomic capture
          ticket = (*next_unit)++;
        }
        if (ticket >= first_unit + units) break;  // belongs to the next block: keep it
        const std::int64_t u = ticket - first_unit;
        ticket = -1;
        const index_t ic = mb.begin(u / n_split);
        const index_t mc = std::min(p.m, mb.begin(u / n_split + 1)) - ic;
        if (ic != packed_ic) {
          pack_a_block(p, apack_mine, ic, mc, pc, kc);
          packed_ic = ic;
        }
        share(b_panels, u % n_split, n_split, begin, end);
        macro_kernel(p, apack_mine, bpack, ic, mc, jc, kc, beta, begin, end, p.relu && pc + kc >= p.k);
      }
      first_unit += units;
    }
  }
}

inline std::size_t a_pack_floats(index_t m, index_t k) {
  return static_cast<std::size_t>((std::min(MC, m) + MR - 1) / MR * MR * std::min(KC, k));
}
inline std::size_t b_pack_floats(index_t n, index_t k) {
  return static_cast<std::size_t>((std::min(NC, n) + NR - 1) / NR * NR * std::min(KC, k));
}

#if MOM_NATIVE_ISA == 512
// ---- few columns: A read in place -------------------------------------------------------------
// A product with at most kDirectCols columns of C spends more time packing A — every element moved into MR-row
// panels — than multiplying: each value of A meets only n columns. Here the B block is packed as usual (it is
// small) and the kernel broadcasts A's values from where they are, kDirectRows rows at a time: from op(A)'s rows
// when they are stored by rows (a router's logits, 43 or 16 experts; a row list allowed), or, when op(A) = Aᵀ,
// from A's rows, which hold op(A)'s columns (the attention backward's dV = Pᵀ·dO and dK = dSᵀ·Q per head, a
// weight gradient dyᵀ·x of a product with at most 64 inputs; a row list allowed). The k blocks, each element's
// k-ordered chain of fused multiply-adds and the store are the blocked path's, so the bits are the same. Scaled
// rows stay on the blocked path: scaling each value where it is broadcast puts a multiply and a register
// broadcast beside every row's fused multiply-adds, on the same ports (SwitchHead's output experts' dW, scaled
// rows of dL/dy: 57 -> 69 ms a step in moeut8 when tried; bench/RESULTS.md).
inline constexpr index_t kDirectCols = 2 * NR;
inline constexpr index_t kDirectRows = 8;
inline bool direct_by_rows(const Operand& a) { return a.cs == 1 && !a.transposed && !a.scale; }
inline bool direct_by_cols(const Operand& a) { return a.rs == 1 && (!a.rows || a.transposed) && !a.scale; }
inline bool direct_fits(const Problem& p) {
  return p.n <= kDirectCols && p.m > kDirectRows && (direct_by_rows(p.a) || direct_by_cols(p.a));
}
// The tiles of rows [r0, r1) of C against the packed B block of k block [pc, pc + kc).
template <class A, class RowsOf>
inline void direct_rows(const Problem& p, const float* bpack, index_t r0, index_t r1, index_t kc, float beta,
                        RowsOf&& a_of) {
  const index_t b_panels = (p.n + NR - 1) / NR;
  for (index_t i0 = r0; i0 < r1; i0 += kDirectRows) {
    const index_t rows = std::min(kDirectRows, r1 - i0);
    const A a = a_of(i0, rows);
    for (index_t jp = 0; jp < b_panels; ++jp)
      edge_tile<A, kDirectRows>(rows, std::min(NR, p.n - jp * NR), kc, a, bpack + jp * NR * kc,
                                p.c + i0 * p.ldc + jp * NR, p.ldc, p.alpha, beta);
  }
}
// Rows [r0, r1) of C, on the calling thread, bpack: this thread's buffer for the packed B block.
inline void run_direct(const Problem& p, float* bpack, index_t r0, index_t r1) {
  const index_t kstep = k_step(p.k), b_panels = (p.n + NR - 1) / NR;
  const bool by_rows = direct_by_rows(p.a);
  for (index_t pc = 0; pc < p.k; pc += kstep) {
    const index_t kc = std::min(kstep, p.k - pc);
    const float beta = pc == 0 ? p.beta : 1.0f;
    pack_b_panels(p, bpack, 0, pc, kc, 0, b_panels);
    if (by_rows) {
      const float* arow[kDirectRows];
      direct_rows<RowsA>(p, bpack, r0, r1, kc, beta, [&](index_t i0, index_t rows) {
        for (index_t i = 0; i < rows; ++i) arow[i] = p.a.row(i0 + i) + pc;
        return RowsA{arow};
      });
      continue;
    }
    // op(A) = Aᵀ: the memory row of each of the block's k, found once for all row tiles.
    const float* col[KC];
    for (index_t k = 0; k < kc; ++k) col[k] = p.a.col(pc + k);
    direct_rows<ColsA>(p, bpack, r0, r1, kc, beta, [&](index_t i0, index_t) { return ColsA{col, i0}; });
  }
}
inline void direct(const Problem& p, int nt) {
  const index_t blocks = (p.m + kDirectRows - 1) / kDirectRows;
  if (nt <= 1 || blocks < 2) {
    return run_direct(p, thread_buffers().b.reserve(b_pack_floats(p.n, p.k)), 0, p.m);
  }
#pragma omp parallel num_threads(nt)
  {
    index_t b = 0, e = 0;
    share(blocks, omp_get_thread_num(), omp_get_num_threads(), b, e);
    run_direct(p, thread_buffers().b.reserve(b_pack_floats(p.n, p.k)), std::min(p.m, b * kDirectRows),
               std::min(p.m, e * kDirectRows));
  }
}
#endif

// ---- a few rows against a row-major weight: y = alpha·x·Wᵀ + beta·y -----------------------
// The decoder's linear layers (infer::Decoder: one row per sequence) and any product of at most
// kGemvRows rows of op(A) whose op(B) columns are contiguous (W [n × k] row-major read as Wᵀ): the
// blocked path above would pad the rows to an MR-row tile (14× the multiply-adds at one row) and pack
// all of W first. Here every row of W is read once, straight from memory, for all rows of x, J rows of W
// at a time (J·rows accumulators), and each dot product is summed across the vector at the end.
// (bench_decode, 2 Zen 5 cores: a batch-1 step of the dense 8-layer model 2.50 -> 0.34 ms, of GPT-2
// small's shape 29.8 -> 11.1 ms.)
inline constexpr index_t kGemvRows = 8;
// Below this many multiply-adds a few-row product stays on one thread (a team costs a few microseconds).
inline constexpr double kGemvParallelMinMacs = 32768;
#if MOM_NATIVE_ISA == 512
using GemvVec = __m512;
inline constexpr index_t kVL = 16, kGemvJ = 4;
[[gnu::always_inline]] inline GemvVec gv_zero() { return _mm512_setzero_ps(); }
[[gnu::always_inline]] inline GemvVec gv_load(const float* p) { return _mm512_loadu_ps(p); }
[[gnu::always_inline]] inline GemvVec gv_load_tail(const float* p, index_t n) {
  return _mm512_maskz_loadu_ps(__mmask16((1u << n) - 1u), p);
}
[[gnu::always_inline]] inline GemvVec gv_fma(GemvVec a, GemvVec b, GemvVec c) { return _mm512_fmadd_ps(a, b, c); }
[[gnu::always_inline]] inline float gv_sum(GemvVec v) { return _mm512_reduce_add_ps(v); }
#else
using GemvVec = __m256;
inline constexpr index_t kVL = 8, kGemvJ = 2;  // 16 ymm registers: see gemv_j
[[gnu::always_inline]] inline GemvVec gv_zero() { return _mm256_setzero_ps(); }
[[gnu::always_inline]] inline GemvVec gv_load(const float* p) { return _mm256_loadu_ps(p); }
[[gnu::always_inline]] inline GemvVec gv_load_tail(const float* p, index_t n) {
  alignas(32) static constexpr int lanes[16] = {-1, -1, -1, -1, -1, -1, -1, -1, 0, 0, 0, 0, 0, 0, 0, 0};
  return _mm256_maskload_ps(p, _mm256_loadu_si256(reinterpret_cast<const __m256i*>(lanes + 8 - n)));
}
[[gnu::always_inline]] inline GemvVec gv_fma(GemvVec a, GemvVec b, GemvVec c) { return _mm256_fmadd_ps(a, b, c); }
[[gnu::always_inline]] inline float gv_sum(GemvVec v) {
  const __m128 h = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  const __m128 q = _mm_add_ps(h, _mm_movehl_ps(h, h));
  return _mm_cvtss_f32(_mm_add_ss(q, _mm_shuffle_ps(q, q, 1)));
}
#endif

// Columns [j0, j1) of C for M rows of x (M <= kGemvRows), J columns at a time.
template <int M, int J>
inline void gemv_columns(const Problem& p, index_t j0, index_t j1) {
  const index_t k = p.k, kv = k / kVL * kVL;
  const float* x[M];
  for (int i = 0; i < M; ++i) x[i] = p.a.row(i);
  index_t j = j0;
  for (; j + J <= j1; j += J) {
    const float* w[J];
    GemvVec acc[M][J];
    for (int q = 0; q < J; ++q) {
      w[q] = p.b.data + (j + q) * p.b.cs;
      for (int i = 0; i < M; ++i) acc[i][q] = gv_zero();
    }
    for (index_t kk = 0; kk < kv; kk += kVL) {
      GemvVec wv[J];
#pragma GCC unroll 4
      for (int q = 0; q < J; ++q) {
        if constexpr (M >= 4)  // the next J rows (several rows of x: the W stream alone outpaced the prefetchers)
          _mm_prefetch(reinterpret_cast<const char*>(w[q] + J * p.b.cs + kk), _MM_HINT_T0);
        wv[q] = gv_load(w[q] + kk);
      }
#pragma GCC unroll 8
      for (int i = 0; i < M; ++i) {
        const GemvVec xv = gv_load(x[i] + kk);
#pragma GCC unroll 4
        for (int q = 0; q < J; ++q) acc[i][q] = gv_fma(xv, wv[q], acc[i][q]);
      }
    }
    if (kv < k) {
      GemvVec wv[J];
      for (int q = 0; q < J; ++q) wv[q] = gv_load_tail(w[q] + kv, k - kv);
      for (int i = 0; i < M; ++i) {
        const GemvVec xv = gv_load_tail(x[i] + kv, k - kv);
        for (int q = 0; q < J; ++q) acc[i][q] = gv_fma(xv, wv[q], acc[i][q]);
      }
    }
    for (int i = 0; i < M; ++i)
      for (int q = 0; q < J; ++q) {
        float& c = p.c[i * p.ldc + j + q];
        c = p.beta == 0.0f ? p.alpha * gv_sum(acc[i][q]) : p.alpha * gv_sum(acc[i][q]) + p.beta * c;
      }
  }
  if (j < j1) {
    if constexpr (J > 1) gemv_columns<M, 1>(p, j, j1);
  }
}
// W rows per pass for M rows of x: M·J accumulators, J rows of W and one of x in registers (32 zmm, 16 ymm).
constexpr int gemv_j(int M) { return kVL == 16 ? (M <= 4 ? 4 : 2) : (M <= 4 ? 2 : 1); }
inline void gemv_any_rows(const Problem& p, index_t j0, index_t j1) {
  switch (p.m) {
    case 1: return gemv_columns<1, gemv_j(1)>(p, j0, j1);
    case 2: return gemv_columns<2, gemv_j(2)>(p, j0, j1);
    case 3: return gemv_columns<3, gemv_j(3)>(p, j0, j1);
    case 4: return gemv_columns<4, gemv_j(4)>(p, j0, j1);
    case 5: return gemv_columns<5, gemv_j(5)>(p, j0, j1);
    case 6: return gemv_columns<6, gemv_j(6)>(p, j0, j1);
    case 7: return gemv_columns<7, gemv_j(7)>(p, j0, j1);
    default: return gemv_columns<8, gemv_j(8)>(p, j0, j1);
  }
}
inline bool gemv_fits(const Problem& p) {
  return p.m <= kGemvRows && p.a.cs == 1 && !p.a.scale && !p.a.transposed && p.b.rs == 1 && !p.b.rows;
}
// The columns shared among nt threads (each a multiple of kGemvJ wide).
inline void gemv(const Problem& p, int nt) {
  const index_t units = (p.n + kGemvJ - 1) / kGemvJ;
  if (nt <= 1 || units < 2) return gemv_any_rows(p, 0, p.n);
#pragma omp parallel num_threads(nt)
  {
    index_t b = 0, e = 0;
    share(units, omp_get_thread_num(), omp_get_num_threads(), b, e);
    gemv_any_rows(p, std::min(p.n, b * kGemvJ), std::min(p.n, e * kGemvJ));
  }
}

// The paths that store C without the blocked tiles (no k, the few rows, the few columns; each thread's share on
// its own, before the team's barrier): then Epilogue::relu as one pass over C.
template <class F>
inline void then_relu(const Problem& p, F&& path) {
  path();
  if (p.relu) relu_tile(p.c, p.m, p.n, p.ldc);
}

// One thread, this thread's buffers. Safe inside an OpenMP parallel region.
inline void gemm_serial(const Problem& p) {
  if (p.m <= 0 || p.n <= 0) return;
  if (p.k <= 0 || p.alpha == 0.0f) return then_relu(p, [&] { scale_c(p.c, p.m, p.n, p.ldc, p.beta); });
  if (gemv_fits(p)) return then_relu(p, [&] { gemv(p, 1); });
#if MOM_NATIVE_ISA == 512
  if (direct_fits(p)) return then_relu(p, [&] { direct(p, 1); });
#endif
  PackBuffers& buf = thread_buffers();
  float* a = buf.a.reserve(a_pack_floats(p.m, p.k));
  float* b = buf.b.reserve(b_pack_floats(p.n, p.k));
  run_serial(p, a, b);
}

// All OpenMP threads (omp_get_max_threads()); small problems, and calls made from
// inside a parallel region, run on the calling thread.
inline void gemm_parallel(const Problem& p) {
  if (p.m <= 0 || p.n <= 0) return;
  if (p.k <= 0 || p.alpha == 0.0f) return then_relu(p, [&] { scale_c(p.c, p.m, p.n, p.ldc, p.beta); });
  const double macs = double(p.m) * double(p.n) * double(p.k);
  const int nt = omp_in_parallel() ? 1 : omp_get_max_threads();
  if (gemv_fits(p)) return then_relu(p, [&] { gemv(p, macs < kGemvParallelMinMacs ? 1 : nt); });
#if MOM_NATIVE_ISA == 512
  if (direct_fits(p)) return then_relu(p, [&] { direct(p, macs < kParallelMinMacs ? 1 : nt); });
#endif
  if (nt <= 1 || macs < kParallelMinMacs) return gemm_serial(p);
  // The caller's B buffer (two blocks) is shared by the team; each thread packs A
  // into its own thread_local buffer.
  float* b = thread_buffers().b.reserve(2 * std::size_t(NC * KC));
  alignas(64) std::int64_t next_unit = 0;
#pragma omp parallel num_threads(nt)
  {
    float* a = thread_buffers().a.reserve(a_pack_floats(p.m, p.k));
    run_parallel(p, a, b, &next_unit, omp_get_thread_num(), omp_get_num_threads());
  }
}

