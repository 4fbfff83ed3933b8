// The cross-backend op table (ggml's test-backend-ops pattern): a test case builds its random inputs
// once, as Arr (a CPU copy and a device copy with the same values), then a table of rows
//   {op name, shapes, one generic lambda running the op on a backend, the outputs to compare}
// that run_table runs in order, each row once on cpu::Backend<T> and once on cuda::Backend<T> (the
// real GPU in test_cuda, the emulated kernels in test_cuda_emu), comparing the outputs after every
// row. The lambda is the same code for both backends (`be` is either one, `on` picks that backend's
// copy of each array), so a row cannot drift between its CPU and its GPU half. Backward ops
// accumulate, so every gradient starts from random values, not zeros.
//
// Tolerances (max |gpu - cpu| / max |cpu| over the array), as in cuda_ops_test.cpp:
//   double: 1e-10 everywhere; float, own kernels: 1e-5 (×10 for sums over rows);
//   float through cuBLAS with TF32 (the default): 1e-2. Integer outputs must be equal.
// Without a CUDA device every case prints "no CUDA device: skipped" once and passes.
#include <catch2/catch.hpp>

#include <functional>
#include <string>
#include <vector>

#include "cuda/cuda_test_support.hpp"

using namespace mom;
using namespace mom::test;

namespace {


// One backend's side of the arrays: its copy of each Arr as a span or a matrix view.
template <class T>
struct On {
  bool device;
  template <class U>
  std::span<U> s(Arr<T, U>& a) const { return device ? a.ds() : a.hs(); }
  template <class U>
  std::span<const U> c(Arr<T, U>& a) const { return s(a); }
  template <class U>
  MatrixView<U> m(Arr<T, U>& a, index_t rows, index_t cols) const { return device ? a.dm(rows, cols) : a.hm(rows, cols); }
  template <class U>
  MatrixView<const U> cm(Arr<T, U>& a, index_t rows, index_t cols) const { return m(a, rows, cols); }
};

// An output to compare after a row: values within tol (relative to the CPU's largest magnitude), or
// integers (indices) exactly.
template <class T>
struct Expect {
  Arr<T>* values = nullptr;
  Arr<T, token_t>* tokens = nullptr;
  double tol = 0;
  std::string what;
};
template <class T>
Expect<T> approx(Arr<T>& a, double tol, std::string what) {
  return {&a, nullptr, tol, std::move(what)};
}
template <class T>
Expect<T> exact(Arr<T, token_t>& a, std::string what) {
  return {nullptr, &a, 0, std::move(what)};
}

template <class T>
struct OpRow {
  std::string op, shape;
  std::function<void(cpu::Backend<T>&, On<T>)> on_cpu;
  std::function<void(cuda::Backend<T>&, On<T>)> on_gpu;
  std::vector<Expect<T>> expect;
};
// A row from one generic lambda [&](auto& be, On<T> on) { be.op(on.s(x), ...); }.
template <class T, class F>
OpRow<T> row(std::string op, std::string shape, F run, std::vector<Expect<T>> expect) {
  return {std::move(op), std::move(shape), run, run, std::move(expect)};
}

template <class T>
void run_table(const std::vector<OpRow<T>>& table) {
  for (const OpRow<T>& r : table) {
    INFO(r.op << " [" << r.shape << "]");
    r.on_cpu(host<T>(), On<T>{false});
    r.on_gpu(gpu<T>(), On<T>{true});
    for (const Expect<T>& e : r.expect) {
      if (e.values) {
        const auto got = e.values->fetch();
        const double err = test::rel_error(got, e.values->h);
        INFO(e.what << ": relative error " << err << " (tolerance " << e.tol << ")");
        CHECK(err <= e.tol);
      } else {
        INFO(e.what);
        CHECK(e.tokens->fetch() == e.tokens->h);
      }
    }
  }
}

std::string dims(std::initializer_list<std::pair<const char*, index_t>> d) {
  std::string s;
  for (const auto& [name, v] : d) {  // appended piece by piece (GCC 12 warns, wrongly, on "x" + std::string)
    if (!s.empty()) s += ' ';
    s.append(name).append("=").append(std::to_string(v));
  }
  return s;
}

}  // namespace

TEMPLATE_TEST_CASE("linear forward/backward match cpu", "[cuda]", float, double) {
  MOM_REQUIRE_GPU();
  using T = TestType;
  test::Rng rng(2);
  const index_t n = 33, in = 40, out = 24;
  for (const bool bias : {true, false}) {
    INFO("bias " << bias);
    auto x = rand_arr<T>(n * in, rng), w = rand_arr<T>(out * in, rng), b = rand_arr<T>(bias ? out : 0, rng);
    auto y = rand_arr<T>(n * out, rng), dy = rand_arr<T>(n * out, rng);
    auto dx = rand_arr<T>(n * in, rng), dw = rand_arr<T>(out * in, rng), db = rand_arr<T>(bias ? out : 0, rng);
    std::vector<Expect<T>> grads = {approx(dx, tol_tf32<T>, "dx"), approx(dw, tol_tf32<T>, "dw")};
    if (bias) grads.push_back(approx(db, tol_kernel<T> * 10, "db"));
    const std::string shape = dims({{"n", n}, {"in", in}, {"out", out}});
    run_table<T>({
        row<T>("linear_forward", shape,
               [&](auto& be, On<T> on) { be.linear_forward(on.m(y, n, out), on.m(x, n, in), on.m(w, out, in), on.c(b)); },
               {approx(y, tol_tf32<T>, "y")}),
        row<T>("linear_backward", shape,
               [&](auto& be, On<T> on) {
                 be.linear_backward(on.m(dx, n, in), on.m(dw, out, in), on.s(db), on.m(dy, n, out), on.m(x, n, in),
                                    on.m(w, out, in));
               },
               grads),
    });
  }
}

TEMPLATE_TEST_CASE("embedding forward/backward match cpu (repeated tokens)", "[cuda]", float, double) {
  MOM_REQUIRE_GPU();
  using T = TestType;
  test::Rng rng(3);
  const index_t V = 11, C = 9, d = 19, seq = 7, B = 3, n = B * seq;
  std::vector<token_t> t(static_cast<std::size_t>(n));
  for (auto& x : t) x = static_cast<token_t>(rng.integer(0, int(V) - 1));
  auto tokens = tok_arr<T>(t);
  auto wte = rand_arr<T>(V * d, rng), wpe = rand_arr<T>(C * d, rng), out = rand_arr<T>(n * d, rng);
  auto dout = rand_arr<T>(n * d, rng), dwte = rand_arr<T>(V * d, rng), dwpe = rand_arr<T>(C * d, rng);
  const std::string shape = dims({{"V", V}, {"C", C}, {"d", d}, {"seq", seq}, {"batch", B}});
  run_table<T>({
      row<T>("embedding_forward", shape,
             [&](auto& be, On<T> on) { be.embedding_forward(on.m(out, n, d), on.s(tokens), on.m(wte, V, d), on.m(wpe, C, d), seq); },
             {approx(out, tol_kernel<T>, "out")}),
      row<T>("embedding_backward", shape,
             [&](auto& be, On<T> on) {
               be.embedding_backward(on.m(dwte, V, d), on.m(dwpe, C, d), on.m(dout, n, d), on.s(tokens), seq);
             },
             {approx(dwte, tol_kernel<T>, "dwte"), approx(dwpe, tol_kernel<T>, "dwpe")}),
  });
}

TEMPLATE_TEST_CASE("embedding without wpe (a RoPE model) matches cpu", "[cuda][rope]", float, double) {
  MOM_REQUIRE_GPU();
  using T = TestType;
  test::Rng rng(31);
  const index_t V = 11, d = 19, seq = 7, B = 3, n = B * seq;
  std::vector<token_t> t(static_cast<std::size_t>(n));
  for (auto& x : t) x = static_cast<token_t>(rng.integer(0, int(V) - 1));
  auto tokens = tok_arr<T>(t);
  auto wte = rand_arr<T>(V * d, rng), out = rand_arr<T>(n * d, rng), dout = rand_arr<T>(n * d, rng);
  auto dwte = rand_arr<T>(V * d, rng);
  const std::string shape = dims({{"V", V}, {"d", d}, {"seq", seq}, {"batch", B}});
  run_table<T>({
      row<T>("embedding_forward (no wpe)", shape,
             [&](auto& be, On<T> on) { be.embedding_forward(on.m(out, n, d), on.s(tokens), on.m(wte, V, d), {}, seq); },
             {approx(out, 0.0, "out")}),
      row<T>("embedding_backward (no wpe)", shape,
             [&](auto& be, On<T> on) {
               be.embedding_backward(on.m(dwte, V, d), {}, on.m(dout, n, d), on.s(tokens), seq);
             },
             {approx(dwte, tol_kernel<T>, "dwte")}),
  });
}

TEMPLATE_TEST_CASE("rope forward/backward match cpu (q|k block of qkv, explicit positions, grouped rows)",
                   "[cuda][rope]", float, double) {
  MOM_REQUIRE_GPU();
  using T = TestType;
  test::Rng rng(32);
  for (const index_t hd : {index_t(8), index_t(64), index_t(80)}) {
    const index_t heads = 3, d = heads * hd, seq = 13, B = 3, n = B * seq, rows = 9;
    INFO("head_dim " << hd);
    auto qkv = rand_arr<T>(n * 3 * d, rng), x = rand_arr<T>(rows * 2 * d, rng);
    std::vector<index_t> p(static_cast<std::size_t>(rows));
    for (auto& v : p) v = rng.integer(0, int(seq) - 1);
    auto pos = Arr<T, index_t>(p);
    // Packed rows 0..8: groups {1..4}, {4..4} (empty), {4..7}; rows 0, 7 and 8 are outside (stale indices).
    auto idx = tok_arr<T>({-3, 0, 14, 38, 2, 25, 13, -1, 99});
    auto offsets = tok_arr<T>({1, 4, 4, 7});
    const std::string shape = dims({{"n", n}, {"heads", heads}, {"head_dim", hd}, {"seq", seq}});
    const auto qk = [&](On<T> on) { return on.m(qkv, n, 3 * d).col_block(0, 2 * d); };
    const auto groups = [&](On<T> on) { return RowGroups{on.c(offsets).data(), 3}; };
    run_table<T>({
        row<T>("rope_forward (row mod seq)", shape,
               [&](auto& be, On<T> on) { be.rope_forward(qk(on), std::span<const index_t>{}, seq, hd, T(10000)); },
               {approx(qkv, tol_kernel<T>, "qkv")}),
        row<T>("rope_backward (row mod seq)", shape,
               [&](auto& be, On<T> on) { be.rope_backward(qk(on), std::span<const index_t>{}, seq, hd, T(10000)); },
               {approx(qkv, tol_kernel<T>, "dqkv")}),
        row<T>("rope_forward (explicit positions)", shape,
               [&](auto& be, On<T> on) { be.rope_forward(on.m(x, rows, 2 * d), on.c(pos), seq, hd, T(500)); },
               {approx(x, tol_kernel<T>, "x")}),
        row<T>("rope_forward (grouped rows)", shape,
               [&](auto& be, On<T> on) {
                 be.rope_forward(on.m(x, rows, 2 * d), on.c(idx), seq, hd, T(10000), groups(on));
               },
               {approx(x, tol_kernel<T>, "x")}),
        row<T>("rope_backward (grouped rows)", shape,
               [&](auto& be, On<T> on) {
                 be.rope_backward(on.m(x, rows, 2 * d), on.c(idx), seq, hd, T(10000), groups(on));
               },
               {approx(x, tol_kernel<T>, "dx")}),
    });
  }
}

TEMPLATE_TEST_CASE("layernorm forward/backward match cpu", "[cuda]", float, double) {
  MOM_REQUIRE_GPU();
  using T = TestType;
  test::Rng rng(4);
  for (const index_t d : {index_t(8), index_t(70), index_t(768)}) {
    const index_t n = 45;
    INFO("d " << d);
    auto x = rand_arr<T>(n * d, rng, -2, 3), g = rand_arr<T>(d, rng), b = rand_arr<T>(d, rng);
    auto out = rand_arr<T>(n * d, rng), mean = rand_arr<T>(n, rng), rstd = rand_arr<T>(n, rng);
    auto dout = rand_arr<T>(n * d, rng), dx = rand_arr<T>(n * d, rng), dg = rand_arr<T>(d, rng), db = rand_arr<T>(d, rng);
    const std::string shape = dims({{"n", n}, {"d", d}});
    run_table<T>({
        row<T>("layernorm_forward", shape,
               [&](auto& be, On<T> on) {
                 be.layernorm_forward(on.m(out, n, d), on.s(mean), on.s(rstd), on.m(x, n, d), on.c(g), on.c(b));
               },
               {approx(out, tol_kernel<T>, "out"), approx(mean, tol_kernel<T>, "mean"), approx(rstd, tol_kernel<T>, "rstd")}),
        row<T>("layernorm_backward", shape,
               [&](auto& be, On<T> on) {
                 be.layernorm_backward(on.m(dx, n, d), on.s(dg), on.s(db), on.m(dout, n, d), on.m(x, n, d), on.c(mean),
                                       on.c(rstd), on.c(g));
               },
               {approx(dx, tol_kernel<T> * 10, "dx"), approx(dg, tol_kernel<T> * 10, "dgamma"),
                approx(db, tol_kernel<T> * 10, "dbeta")}),
    });
  }
}

TEMPLATE_TEST_CASE("elementwise ops match cpu (gelu relu add axpy scale)", "[cuda]", float, double) {
  MOM_REQUIRE_GPU();
  using T = TestType;
  test::Rng rng(5);
  const index_t n = 100003;  // several grid-stride rounds are not needed; odd size checks the tail
  auto x = rand_arr<T>(n, rng, -4, 4), a = rand_arr<T>(n, rng), dout = rand_arr<T>(n, rng);
  auto out = rand_arr<T>(n, rng), dx = rand_arr<T>(n, rng);
  const std::string shape = dims({{"n", n}});
  // In order: later rows start from what earlier rows left in out and dx (on both backends alike).
  run_table<T>({
      row<T>("gelu_forward", shape, [&](auto& be, On<T> on) { be.gelu_forward(on.s(out), on.c(x)); },
             {approx(out, tol_kernel<T>, "gelu")}),
      row<T>("gelu_backward", shape, [&](auto& be, On<T> on) { be.gelu_backward(on.s(dx), on.c(x), on.c(dout)); },
             {approx(dx, tol_kernel<T>, "gelu dx")}),
      row<T>("relu_forward", shape, [&](auto& be, On<T> on) { be.relu_forward(on.s(out), on.c(x)); },
             {approx(out, 0.0, "relu")}),
      row<T>("relu_backward", shape, [&](auto& be, On<T> on) { be.relu_backward(on.s(dx), on.c(x), on.c(dout)); },
             {approx(dx, tol_kernel<T>, "relu dx")}),
      // Store::overwrite: dx = dout · f'(x), whatever dx held (the rows above left it nonzero).
      row<T>("gelu_backward (overwrite)", shape,
             [&](auto& be, On<T> on) { be.gelu_backward(on.s(dx), on.c(x), on.c(dout), Store::overwrite); },
             {approx(dx, tol_kernel<T>, "gelu dx overwritten")}),
      row<T>("relu_backward (overwrite)", shape,
             [&](auto& be, On<T> on) { be.relu_backward(on.s(dx), on.c(x), on.c(dout), Store::overwrite); },
             {approx(dx, tol_kernel<T>, "relu dx overwritten")}),
      row<T>("add_forward", shape, [&](auto& be, On<T> on) { be.add_forward(on.s(out), on.c(x), on.c(a)); },
             {approx(out, 0.0, "add")}),
      row<T>("axpy", shape, [&](auto& be, On<T> on) { be.axpy(on.s(out), T(-0.25), on.c(a)); },
             {approx(out, tol_kernel<T>, "axpy")}),
      row<T>("scale", shape, [&](auto& be, On<T> on) { be.scale(on.s(out), T(1.5)); },
             {approx(out, tol_kernel<T>, "scale")}),
  });
}

TEMPLATE_TEST_CASE("cross-entropy forward/backward match cpu (ignored rows and aliased dlogits)", "[cuda]", float,
                   double) {
  MOM_REQUIRE_GPU();
  using T = TestType;
  test::Rng rng(6);
  for (const index_t V : {index_t(7), index_t(300), index_t(5000)}) {
    const index_t n = 23;
    INFO("V " << V);
    std::vector<token_t> t(static_cast<std::size_t>(n));
    for (auto& x : t) x = static_cast<token_t>(rng.integer(0, int(V) - 1));
    t[3] = -1;
    t[10] = -1;
    auto targets = tok_arr<T>(t);
    auto logits = rand_arr<T>(n * V, rng, -5, 5), lse = rand_arr<T>(n, rng), loss = rand_arr<T>(1, rng);
    const std::string shape = dims({{"n", n}, {"V", V}});
    run_table<T>({
        row<T>("cross_entropy_forward", shape,
               [&](auto& be, On<T> on) { be.cross_entropy_forward(on.s(loss), on.s(lse), on.m(logits, n, V), on.s(targets)); },
               {approx(loss, tol_kernel<T>, "loss"), approx(lse, tol_kernel<T>, "lse")}),
        // dlogits written over the logits (as the model does).
        row<T>("cross_entropy_backward", shape,
               [&](auto& be, On<T> on) {
                 be.cross_entropy_backward(on.m(logits, n, V), on.m(logits, n, V), on.c(lse), on.s(targets), T(0.5));
               },
               {approx(logits, tol_kernel<T>, "dlogits")}),
    });
  }
}

TEMPLATE_TEST_CASE("gather and scatter-add with backward match cpu (repeated indices and weights)", "[cuda]", float,
                   double) {
  MOM_REQUIRE_GPU();
  using T = TestType;
  test::Rng rng(9);
  const index_t Tn = 17, n = 40, d = 45;
  std::vector<token_t> ix(static_cast<std::size_t>(n));
  for (auto& x : ix) x = static_cast<token_t>(rng.integer(0, int(Tn) - 1));
  auto idx = tok_arr<T>(ix);
  auto table = rand_arr<T>(Tn * d, rng), packed = rand_arr<T>(n * d, rng), w = rand_arr<T>(n, rng);
  const std::string shape = dims({{"rows", Tn}, {"n", n}, {"d", d}});
  run_table<T>({row<T>("gather_rows", shape,
                       [&](auto& be, On<T> on) { be.gather_rows(on.m(packed, n, d), on.m(table, Tn, d), on.s(idx)); },
                       {approx(packed, 0.0, "gather")})});
  for (const bool weighted : {true, false}) {
    INFO("weighted " << weighted);
    const auto weights = [&](On<T> on) { return weighted ? on.c(w) : std::span<const T>(); };
    auto out = rand_arr<T>(Tn * d, rng), din = rand_arr<T>(n * d, rng), dwts = rand_arr<T>(n, rng);
    run_table<T>({
        row<T>("scatter_add_rows", shape,
               [&](auto& be, On<T> on) { be.scatter_add_rows(on.m(out, Tn, d), on.m(packed, n, d), on.s(idx), weights(on)); },
               {approx(out, tol_kernel<T>, "scatter_add")}),
        row<T>("scatter_add_rows_backward", shape,
               [&](auto& be, On<T> on) {
                 be.scatter_add_rows_backward(on.m(din, n, d), on.s(dwts), on.m(out, Tn, d), on.m(packed, n, d),
                                              on.s(idx), weights(on));
               },
               {approx(din, tol_kernel<T>, "din"), approx(dwts, tol_kernel<T>, "dweights")}),
        row<T>("scatter_add_rows_backward (overwrite)", shape,
               [&](auto& be, On<T> on) {
                 be.scatter_add_rows_backward(on.m(din, n, d), on.s(dwts), on.m(out, Tn, d), on.m(packed, n, d),
                                              on.s(idx), weights(on), Store::overwrite);
               },
               {approx(din, tol_kernel<T>, "din overwritten"), approx(dwts, tol_kernel<T>, "dweights overwritten")}),
    });
  }
}

TEMPLATE_TEST_CASE("top-k and row softmax with backward match cpu (ties and negative scale)", "[cuda]", float,
                   double) {
  MOM_REQUIRE_GPU();
  using T = TestType;
  test::Rng rng(10);
  const index_t n = 300, N = 12;
  std::vector<T> xv(static_cast<std::size_t>(n * N));
  for (auto& v : xv) v = T(rng.integer(-4, 4)) / T(4);  // few distinct values: many ties
  Arr<T> x(xv);
  for (const index_t k : {index_t(1), index_t(3), index_t(12)}) {
    INFO("k " << k);
    auto values = rand_arr<T>(n * k, rng), dvalues = rand_arr<T>(n * k, rng), dx = rand_arr<T>(n * N, rng);
    auto indices = tok_arr<T>(std::vector<token_t>(static_cast<std::size_t>(n * k), 0));
    const std::string shape = dims({{"n", n}, {"N", N}, {"k", k}});
    run_table<T>({
        row<T>("topk_rows", shape,
               [&](auto& be, On<T> on) { be.topk_rows(on.m(values, n, k), on.m(indices, n, k), on.m(x, n, N)); },
               {approx(values, 0.0, "topk values"), exact(indices, "topk indices")}),
        row<T>("topk_rows_backward", shape,
               [&](auto& be, On<T> on) { be.topk_rows_backward(on.m(dx, n, N), on.m(dvalues, n, k), on.cm(indices, n, k)); },
               {approx(dx, tol_kernel<T>, "topk dx")}),
    });
  }
  for (const T scale : {T(1), T(0.5), T(-2)}) {
    INFO("scale " << scale);
    auto xs = rand_arr<T>(n * N, rng, -3, 3), y = rand_arr<T>(n * N, rng), dy = rand_arr<T>(n * N, rng);
    auto dx = rand_arr<T>(n * N, rng);
    const std::string shape = dims({{"n", n}, {"N", N}});
    run_table<T>({
        row<T>("softmax_rows", shape, [&](auto& be, On<T> on) { be.softmax_rows(on.m(y, n, N), on.m(xs, n, N), scale); },
               {approx(y, tol_kernel<T>, "softmax")}),
        row<T>("softmax_rows_backward", shape,
               [&](auto& be, On<T> on) { be.softmax_rows_backward(on.m(dx, n, N), on.m(dy, n, N), on.m(y, n, N), scale); },
               {approx(dx, tol_kernel<T>, "softmax dx")}),
    });
  }
}

TEMPLATE_TEST_CASE("GRU cell forward/backward match cpu", "[cuda]", float, double) {
  MOM_REQUIRE_GPU();
  using T = TestType;
  test::Rng rng(11);
  const index_t n = 21, I = 13, H = 6;
  auto x = rand_arr<T>(n * I, rng), h = rand_arr<T>(n * H, rng), wih = rand_arr<T>(3 * H * I, rng);
  auto whh = rand_arr<T>(3 * H * H, rng), bih = rand_arr<T>(3 * H, rng), bhh = rand_arr<T>(3 * H, rng);
  auto hout = rand_arr<T>(n * H, rng), gates = rand_arr<T>(n * 6 * H, rng), dhout = rand_arr<T>(n * H, rng);
  auto dx = rand_arr<T>(n * I, rng), dh = rand_arr<T>(n * H, rng), dwih = rand_arr<T>(3 * H * I, rng);
  auto dwhh = rand_arr<T>(3 * H * H, rng), dbih = rand_arr<T>(3 * H, rng), dbhh = rand_arr<T>(3 * H, rng);
  auto scratch = rand_arr<T>(n * 6 * H, rng);
  const std::string shape = dims({{"n", n}, {"in", I}, {"hidden", H}});
  run_table<T>({
      row<T>("gru_cell_forward", shape,
             [&](auto& be, On<T> on) {
               be.gru_cell_forward(on.m(hout, n, H), on.m(gates, n, 6 * H), on.m(x, n, I), on.m(h, n, H),
                                   on.m(wih, 3 * H, I), on.m(whh, 3 * H, H), on.c(bih), on.c(bhh));
             },
             {approx(gates, tol_tf32<T>, "gates"), approx(hout, tol_tf32<T>, "h_out")}),
      // db: column sums of the gate gradients, which read each backend's own gates from gru_cell_forward's TF32
      // GEMMs: 4.5e-4 apart in float on an H100, where the CPU emulation's plain fp32 GEMM stayed within 1e-4.
      row<T>("gru_cell_backward", shape,
             [&](auto& be, On<T> on) {
               be.gru_cell_backward(on.m(dx, n, I), on.m(dh, n, H), on.m(dwih, 3 * H, I), on.m(dwhh, 3 * H, H),
                                    on.s(dbih), on.s(dbhh), on.m(scratch, n, 6 * H), on.m(dhout, n, H),
                                    on.m(gates, n, 6 * H), on.m(x, n, I), on.m(h, n, H), on.m(wih, 3 * H, I),
                                    on.m(whh, 3 * H, H));
             },
             {approx(dx, tol_tf32<T>, "dx"), approx(dh, tol_tf32<T>, "dh"), approx(dwih, tol_tf32<T>, "dw_ih"),
              approx(dwhh, tol_tf32<T>, "dw_hh"), approx(dbih, tol_tf32<T>, "db_ih"), approx(dbhh, tol_tf32<T>, "db_hh")}),
  });
}

TEMPLATE_TEST_CASE("router top-K forward and backward match cpu", "[cuda][routing]", float, double) {
  MOM_REQUIRE_GPU();
  using T = TestType;
  test::Rng rng(21);
  const index_t n = 50, E = 7;
  for (const index_t k : {index_t(1), index_t(2), index_t(7)})
    for (const bool renormalise : {true, false})
      for (const bool with_col : {true, false}) {
        INFO("k " << k << " renormalise " << renormalise << " dprobs_col " << with_col);
        auto logits = rand_arr<T>(n * E, rng, -2, 2), probs = rand_arr<T>(n * E, rng), w = rand_arr<T>(n * k, rng);
        auto picks = tok_arr<T>(std::vector<token_t>(static_cast<std::size_t>(n * k), 0));
        auto dw = rand_arr<T>(n * k, rng), dcol = rand_arr<T>(with_col ? E : 0, rng), dlogits = rand_arr<T>(n * E, rng);
        const std::string shape = dims({{"n", n}, {"E", E}, {"k", k}});
        run_table<T>({
            row<T>("route_topk_forward", shape,
                   [&](auto& be, On<T> on) {
                     be.route_topk_forward(on.m(w, n, k), on.m(picks, n, k), on.m(probs, n, E), on.m(logits, n, E),
                                           T(0.7), renormalise);
                   },
                   {approx(probs, tol_kernel<T>, "probs"), approx(w, tol_kernel<T>, "weights"), exact(picks, "picks")}),
            row<T>("route_topk_backward", shape,
                   [&](auto& be, On<T> on) {
                     be.route_topk_backward(on.m(dlogits, n, E), on.m(dw, n, k), on.m(w, n, k), on.m(probs, n, E),
                                            on.cm(picks, n, k), T(0.7), renormalise, on.c(dcol));
                   },
                   {approx(dlogits, tol_kernel<T> * 10, "dlogits")}),
        });
      }
}
