// bench_allreduce_overlap: does overlapping the data-parallel gradient reduction with backward pay on this machine?
// (issue 17; docs/distributed.md, "Overlap with backward"). For the real dense8 and mom8-p models (mom-train's
// `--arch dense8` / `--arch mom8-p`: d 256, 8 heads, d_ff 1024, byte vocabulary, seq 256), every rank runs a forward
// (untimed), then, from a barrier, one of these (timed on every rank; a step's time is the slower rank's):
//
//   backward          backward alone                                   } (c): the two parts, each from a barrier
//   reduce            the Trainer's reduction alone (allreduce_sum)    }
//   serial            backward, then MpiCommunicator::allreduce_sum of the whole gradient buffer: what the Trainer
//                     does (fixed rank order: all-to-all of shards, rank-order sums, all-gather)           (a)
//   serial-mpi        backward, then one blocking MPI_Allreduce of the buffer (library order)
//   overlap/B         (b), the best case of any bucketing scheme: at the start of backward, every bucket of B floats
//                     of a second buffer of the gradient's size starts its reduction in the Trainer's fixed order
//                     (MPI_Ialltoallv; when it completes, the rank-order sum, then MPI_Iallgatherv); backward runs
//                     and polls MPI (MPI_Test) after every backward op; then the rest is waited for. A real scheme
//                     could start a bucket only once backward has finished its gradients, so it cannot do better.
//   overlap-mpi/B     the same with MPI_Iallreduce per bucket (library order: not bit-reproducible)
//   overlap-nopoll/B  overlap/B without the polls: MPI progresses only in the final waits
//
// The modes are interleaved (each repetition runs every mode once, in an order rotated by the repetition), so a
// load that comes and goes on a shared machine falls on all of them. Rank 0 prints min and median per mode and
// their ratios to `serial`, and "paired": the median over repetitions of a mode's time over the same repetition's
// `serial` time (the two ran seconds apart, so a slow drift of the machine's load cancels). "bwd" is the time to
// the end of backward (with the polls and the MPI work they do), "tail" the wait after it (the longer of the
// ranks'; it includes waiting for the slower rank), "in polls" the time inside the polls during backward (the
// reduction's copies and sums done on the rank's own core), all medians of the slower rank's.
//
//   OMP_NUM_THREADS=1 mpirun --oversubscribe -np 2 build/bench/bench_allreduce_overlap [--reps R] [--batch b]
//       [--only dense8,mom8-p] [--bucket floats[,floats...]]          (bench/RESULTS.md, "Issue 17")
#include <mom/backend/cpu.hpp>
#include <mom/models/mom_models.hpp>
#include <mom/mom.hpp>
#include <mom/train/distributed.hpp>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <random>
#include <string>
#include <vector>

using namespace mom;

namespace {

using Clock = std::chrono::steady_clock;

// Polls MPI between backward ops while a bucketed reduction is in flight (nullptr: nothing to poll).
struct Poller {
  virtual void poll() = 0;
  long polls = 0;
  double seconds = 0;  // inside poll(): the MPI work (copies, sums) done on this rank's core during backward
};
Poller* g_poller = nullptr;

// cpu::Backend<float> that calls the poller after each backward op (the model keeps its own copy of the backend,
// so the poller is a global).
struct PollingBackend : cpu::Backend<float> {
  using Base = cpu::Backend<float>;
  static void hook() {
    if (!g_poller) return;
    const auto t0 = std::chrono::steady_clock::now();
    g_poller->poll();
    ++g_poller->polls, g_poller->seconds += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  }
  using Base::attention_backward;
  using Base::attention_packed_backward;
  using Base::cross_entropy_backward;
  using Base::embedding_backward;
  using Base::grouped_linear_backward;
  using Base::gru_cell_backward;
  using Base::layernorm_backward;
  using Base::linear_backward;
  void linear_backward(M dx, M dw, S db, CM dy, CM x, CM w, Store dx_store = Store::add) const { Base::linear_backward(dx, dw, db, dy, x, w, dx_store), hook(); }
  void embedding_backward(M dwte, M dwpe, CM dout, Tok tokens, index_t seq) const {
    Base::embedding_backward(dwte, dwpe, dout, tokens, seq), hook();
  }
  void layernorm_backward(M dx, S dgamma, S dbeta, CM dout, CM x, CS mean, CS rstd, CS gamma) const {
    Base::layernorm_backward(dx, dgamma, dbeta, dout, x, mean, rstd, gamma), hook();
  }
  void cross_entropy_backward(M dlogits, CM logits, CS lse, Tok targets, float dloss, token_t ignore = -1) const {
    Base::cross_entropy_backward(dlogits, logits, lse, targets, dloss, ignore), hook();
  }
  void attention_backward(M dqkv, CM dout, CM out, CS lse, CM qkv, index_t batch, index_t seq, index_t heads) const {
    Base::attention_backward(dqkv, dout, out, lse, qkv, batch, seq, heads), hook();
  }
  void gru_cell_backward(M dx, M dh, M dw_ih, M dw_hh, S db_ih, S db_hh, M scratch, CM dh_out, CM gates, CM x, CM h,
                         CM w_ih, CM w_hh) const {
    Base::gru_cell_backward(dx, dh, dw_ih, dw_hh, db_ih, db_hh, scratch, dh_out, gates, x, h, w_ih, w_hh), hook();
  }
  void attention_packed_backward(M dq, M dk, M dv, CM dout, CM out, CS lse, CM q, CM k, CM v, Tok q_tok, Tok k_tok,
                                 index_t seq, index_t heads) const {
    Base::attention_packed_backward(dq, dk, dv, dout, out, lse, q, k, v, q_tok, k_tok, seq, heads), hook();
  }
  void grouped_linear_backward(M dx, PG dw, PG db, CM dy, CM x, CPG w, RowGroups g, Store dx_store = Store::add) const {
    Base::grouped_linear_backward(dx, dw, db, dy, x, w, g, dx_store), hook();
  }
  void grouped_linear_backward(M dx, PG dw, PG db, CM dy, CM x, Tok idx, CPG w, RowGroups g,
                               Store dx_store = Store::add) const {
    Base::grouped_linear_backward(dx, dw, db, dy, x, idx, w, g, dx_store), hook();
  }
  void grouped_linear_backward(M dx, PG dw, ScaledRows<float> dy, CM x, Tok idx, CPG w, RowGroups g,
                               Store dx_store = Store::add) const {
    Base::grouped_linear_backward(dx, dw, dy, x, idx, w, g, dx_store), hook();
  }
};

constexpr Dims dims{.d_model = 256, .heads = 8, .d_ff = 1024, .vocab = 256, .context = 256};  // mom8_dims
using Dense8 = LM<dims, Dense<8>>;
using MoM8P = LM<dims, Strategy_11411<MoM_P<>>>;

// Buckets of a buffer, last bucket first (the order in which backward finishes the gradients), each reduced in the
// Trainer's fixed order: Ialltoallv of its N shards, rank-order sum of the shard this rank owns, Iallgatherv.
// Collectives start in the same order on every rank: all the all-to-alls, then the all-gathers in bucket order
// (a bucket's all-gather starts once its own all-to-all and every earlier bucket's all-gather have started).
struct FixedOrderBuckets final : Poller {
  struct Bucket {
    float* x = nullptr;
    std::vector<int> counts, displs, rcounts, rdispls;
    std::vector<float> in;
    MPI_Request a2a = MPI_REQUEST_NULL, gather = MPI_REQUEST_NULL;
  };
  std::vector<Bucket> buckets;
  std::size_t next_gather = 0;
  int rank = 0, ranks = 1;

  FixedOrderBuckets(std::span<float> buf, std::size_t bucket_floats, int rank_, int ranks_) : rank(rank_), ranks(ranks_) {
    const auto R = std::size_t(ranks);
    for (std::size_t end = buf.size(); end > 0;) {
      const std::size_t begin = end > bucket_floats ? end - bucket_floats : 0, n = end - begin;
      Bucket b;
      b.x = buf.data() + begin;
      b.counts.resize(R), b.displs.resize(R), b.rcounts.resize(R), b.rdispls.resize(R);
      for (std::size_t r = 0; r < R; ++r) b.displs[r] = int(r * n / R), b.counts[r] = int((r + 1) * n / R) - b.displs[r];
      const int mine = b.counts[std::size_t(rank)];
      for (std::size_t r = 0; r < R; ++r) b.rcounts[r] = mine, b.rdispls[r] = int(r) * mine;
      b.in.resize(R * std::size_t(mine));
      buckets.push_back(std::move(b));
      end = begin;
    }
  }
  void start() {
    next_gather = 0;
    for (Bucket& b : buckets)
      MPI_Ialltoallv(b.x, b.counts.data(), b.displs.data(), MPI_FLOAT, b.in.data(), b.rcounts.data(), b.rdispls.data(),
                     MPI_FLOAT, MPI_COMM_WORLD, &b.a2a);
  }
  void sum_and_gather(Bucket& b) {
    const int mine = b.counts[std::size_t(rank)];
    float* out = b.x + b.displs[std::size_t(rank)];
    std::memcpy(out, b.in.data(), std::size_t(mine) * sizeof(float));
    for (int r = 1; r < ranks; ++r) {
      const float* part = b.in.data() + std::size_t(r) * std::size_t(mine);
      for (int i = 0; i < mine; ++i) out[i] += part[i];
    }
    MPI_Iallgatherv(MPI_IN_PLACE, 0, MPI_FLOAT, b.x, b.counts.data(), b.displs.data(), MPI_FLOAT, MPI_COMM_WORLD,
                    &b.gather);
  }
  void poll() override {
    while (next_gather < buckets.size()) {
      int done = 0;
      MPI_Test(&buckets[next_gather].a2a, &done, MPI_STATUS_IGNORE);
      if (!done) return;
      sum_and_gather(buckets[next_gather++]);
    }
    int done = 0;  // every all-gather started: drive them
    MPI_Test(&buckets.back().gather, &done, MPI_STATUS_IGNORE);
  }
  void finish() {
    for (; next_gather < buckets.size(); ++next_gather) {
      MPI_Wait(&buckets[next_gather].a2a, MPI_STATUS_IGNORE);
      sum_and_gather(buckets[next_gather]);
    }
    for (Bucket& b : buckets) MPI_Wait(&b.gather, MPI_STATUS_IGNORE);
  }
};

// Buckets reduced by MPI_Iallreduce (the library's order of additions).
struct IallreduceBuckets final : Poller {
  std::vector<std::span<float>> buckets;
  std::vector<MPI_Request> req;
  IallreduceBuckets(std::span<float> buf, std::size_t bucket_floats) {
    for (std::size_t end = buf.size(); end > 0;) {
      const std::size_t begin = end > bucket_floats ? end - bucket_floats : 0;
      buckets.push_back(buf.subspan(begin, end - begin));
      end = begin;
    }
    req.assign(buckets.size(), MPI_REQUEST_NULL);
  }
  void start() {
    for (std::size_t i = 0; i < buckets.size(); ++i)
      MPI_Iallreduce(MPI_IN_PLACE, buckets[i].data(), int(buckets[i].size()), MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD, &req[i]);
  }
  void poll() override {
    int done = 0;
    MPI_Testall(int(req.size()), req.data(), &done, MPI_STATUSES_IGNORE);
  }
  void finish() { MPI_Waitall(int(req.size()), req.data(), MPI_STATUSES_IGNORE); }
};

struct Stats {
  std::vector<double> t, bwd, tail, in_polls;  // the step; of which backward (with the polls), the wait after it;
                                              // the time inside the polls
  double polls = 0;
};

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  const std::size_t n = v.size();
  return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

template <class Model>
void run(const char* name, mom::train::MpiCommunicator& comm, index_t batch, index_t seq, int reps,
         const std::vector<std::size_t>& bucket_sizes) {
  ModelInstance<Model, PollingBackend> m(1, PollingBackend{});
  m.reserve(batch, seq);
  const index_t n = batch * seq;
  std::mt19937_64 rng(7 + std::uint64_t(comm.rank()));  // each rank its own tokens
  std::uniform_int_distribution<token_t> dist(0, token_t(Model::dims.vocab - 1));
  std::vector<token_t> tokens(std::size_t(n + 1));
  for (auto& t : tokens) t = dist(rng);
  const std::span<const token_t> x(tokens.data(), std::size_t(n)), y(tokens.data() + 1, std::size_t(n));
  const std::span<float> grads = m.grads();
  std::vector<float> other(grads.size(), 0.0f);  // the overlapped reductions' buffer (zeros: no overflow)

  struct Mode {
    std::string name;
    int kind;  // 0 backward+reduce (c), 1 serial, 2 serial-mpi, 3 overlap, 4 overlap-mpi, 5 overlap-nopoll
    std::size_t bucket = 0;
  };
  std::vector<Mode> modes{{"backward | reduce (c)", 0}, {"serial (a)", 1}, {"serial-mpi", 2}};
  for (std::size_t b : bucket_sizes) {
    const std::string s = std::to_string(b);
    modes.push_back({"overlap/" + s + " (b)", 3, b});
    modes.push_back({"overlap-mpi/" + s, 4, b});
    modes.push_back({"overlap-nopoll/" + s, 5, b});
  }
  std::vector<Stats> st(modes.size() + 1);  // the last: reduce alone (part of mode 0)
  std::vector<std::unique_ptr<FixedOrderBuckets>> fixed;
  std::vector<std::unique_ptr<IallreduceBuckets>> lib;
  for (std::size_t b : bucket_sizes) {
    fixed.push_back(std::make_unique<FixedOrderBuckets>(std::span<float>(other), b, comm.rank(), comm.size()));
    lib.push_back(std::make_unique<IallreduceBuckets>(std::span<float>(other), b));
  }

  // Once: the bucketed reductions give the Trainer's result (fixed order: bit for bit; MPI_Iallreduce: every
  // element within 1e-6 relative), so the modes time the same reduction.
  {
    std::mt19937 r2(11 + unsigned(comm.rank()));
    std::uniform_real_distribution<float> u(-1.0f, 1.0f);
    std::vector<float> input(other.size()), want;
    for (float& v : input) v = u(r2);
    want = input;
    comm.allreduce_sum(std::span<float>(want));
    for (std::size_t i = 0; i < bucket_sizes.size(); ++i) {
      other = input;
      fixed[i]->start(), fixed[i]->finish();
      MOM_CHECK(std::memcmp(other.data(), want.data(), want.size() * sizeof(float)) == 0,
                "bucketed fixed-order reduction differs from allreduce_sum");
      other = input;
      lib[i]->start(), lib[i]->finish();
      for (std::size_t j = 0; j < want.size(); ++j)
        MOM_CHECK(std::abs(other[j] - want[j]) <= 1e-6f * (1 + std::abs(want[j])), "MPI_Iallreduce buckets differ at ", j);
    }
    std::fill(other.begin(), other.end(), 0.0f);
  }

  // The slower rank's time (what a step waits for).
  auto slowest = [&](double t) {
    MPI_Allreduce(MPI_IN_PLACE, &t, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
    return t;
  };
  auto secs = [](Clock::time_point a, Clock::time_point b) { return std::chrono::duration<double>(b - a).count(); };

  auto one = [&](std::size_t mi, bool record) {
    const Mode& md = modes[mi];
    m.zero_grad();
    m.forward(x, y, batch, seq);
    comm.barrier();
    const std::size_t bi = std::size_t(std::find(bucket_sizes.begin(), bucket_sizes.end(), md.bucket) - bucket_sizes.begin());
    const auto t0 = Clock::now();
    double t = 0, t_reduce = 0, polls = 0, in_polls = 0;
    Clock::time_point t_bwd{};
    // A bucketed reduction started before backward, polled between backward's ops (poll: false for the
    // no-poll control), finished after it.
    const auto bucketed = [&](auto& buckets, bool poll) {
      buckets.polls = 0, buckets.seconds = 0;
      buckets.start();
      if (poll) g_poller = &buckets;
      m.backward();
      t_bwd = Clock::now();
      g_poller = nullptr;
      buckets.finish();
      polls = double(buckets.polls), in_polls = buckets.seconds;
    };
    switch (md.kind) {
      case 0: {
        m.backward();
        const auto t1 = Clock::now();
        t = secs(t0, t1);
        t = slowest(t);  // also a barrier
        const auto t2 = Clock::now();
        comm.allreduce_sum(grads);
        t_reduce = slowest(secs(t2, Clock::now()));
        break;
      }
      case 1: m.backward(), t_bwd = Clock::now(), comm.allreduce_sum(grads); break;
      case 2:
        m.backward();
        t_bwd = Clock::now();
        MPI_Allreduce(MPI_IN_PLACE, grads.data(), int(grads.size()), MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
        break;
      case 3: case 5: bucketed(*fixed[bi], md.kind == 3); break;
      case 4: bucketed(*lib[bi], true); break;
    }
    double bwd = 0, tail = 0;
    if (md.kind != 0) {
      const auto t1 = Clock::now();
      bwd = slowest(secs(t0, t_bwd)), tail = slowest(secs(t_bwd, t1)), t = slowest(secs(t0, t1));
    }
    if (!record) return;
    st[mi].t.push_back(t);
    in_polls = slowest(in_polls);
    if (md.kind != 0) st[mi].bwd.push_back(bwd), st[mi].tail.push_back(tail), st[mi].in_polls.push_back(in_polls);
    st[mi].polls = polls;
    if (md.kind == 0) st.back().t.push_back(t_reduce);
  };

  for (std::size_t mi = 0; mi < modes.size(); ++mi) one(mi, false);  // warm-up: every mode once
  for (int r = 0; r < reps; ++r)
    for (std::size_t i = 0; i < modes.size(); ++i) one((i + std::size_t(r)) % modes.size(), true);

  if (comm.rank() != 0) return;
  const double serial_min = *std::min_element(st[1].t.begin(), st[1].t.end()), serial_med = median(st[1].t);
  std::printf("\n%s: %lld parameters (%.1f MB of gradients), batch %lld x seq %lld per rank, %d repetitions\n", name,
              (long long)Model::params, double(grads.size()) * 4 / 1e6, (long long)batch, (long long)seq, reps);
  std::printf("%-24s %6s %9s %9s %8s %8s %8s %9s %8s %6s %9s\n", "mode", "bucket", "min ms", "med ms", "min/(a)",
              "med/(a)", "paired", "bwd med", "tail med", "polls", "in polls");
  auto line = [&](const std::string& label, std::size_t bucket, const Stats& s) {
    const double mn = *std::min_element(s.t.begin(), s.t.end()), md = median(s.t);
    const std::string b = bucket ? std::to_string(bucket * 4 >> 20) + "MiB" : "-";
    std::vector<double> paired(s.t.size());  // this repetition's time over the same repetition's serial (a)
    for (std::size_t r = 0; r < s.t.size(); ++r) paired[r] = s.t[r] / st[1].t[r];
    std::printf("%-24s %6s %9.1f %9.1f %8.3f %8.3f %8.3f ", label.c_str(), b.c_str(), mn * 1e3, md * 1e3,
                mn / serial_min, md / serial_med, median(paired));
    if (s.bwd.empty()) std::printf("%9s %8s %6s %9s\n", "-", "-", "-", "-");
    else std::printf("%9.1f %8.1f %6.0f %9.1f\n", median(s.bwd) * 1e3, median(s.tail) * 1e3, s.polls,
                     median(s.in_polls) * 1e3);
  };
  line("backward alone (c)", 0, st[0]);
  line("reduce alone (c)", 0, st.back());
  for (std::size_t mi = 1; mi < modes.size(); ++mi) line(modes[mi].name, modes[mi].bucket, st[mi]);
  std::fflush(stdout);
}

}  // namespace

int main(int argc, char** argv) {
  mom::train::MpiCommunicator comm(&argc, &argv);
  int reps = 10;
  index_t batch = 8, seq = 256;
  std::string only = "dense8,mom8-p";
  std::vector<std::size_t> buckets{std::size_t(1) << 18, std::size_t(1) << 20};  // 1 MiB, 4 MiB of floats
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    const char* v = i + 1 < argc ? argv[i + 1] : nullptr;
    if (a == "--reps" && v) reps = std::atoi(v), ++i;
    else if (a == "--batch" && v) batch = std::atoll(v), ++i;
    else if (a == "--only" && v) only = v, ++i;
    else if (a == "--bucket" && v) {
      buckets.clear();
      for (std::string s = v; !s.empty();) {
        const auto c = s.find(',');
        buckets.push_back(std::size_t(std::stoull(s.substr(0, c))));
        s = c == std::string::npos ? "" : s.substr(c + 1);
      }
      ++i;
    } else {
      if (comm.rank() == 0)
        std::fprintf(stderr, "usage: mpirun -np N bench_allreduce_overlap [--reps R] [--batch b] [--only dense8,mom8-p] "
                             "[--bucket floats,...]\n");
      return 2;
    }
  }
  if (comm.rank() == 0) std::printf("%s, %s\n", comm.name().c_str(), "times: the slower rank's, from a barrier");
  if (only.find("dense8") != std::string::npos) run<Dense8>("dense8", comm, batch, seq, reps, buckets);
  if (only.find("mom8-p") != std::string::npos) run<MoM8P>("mom8-p", comm, batch, seq, reps, buckets);
  return 0;
}
