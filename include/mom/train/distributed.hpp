// Data-parallel training across processes (docs/distributed.md): the few collective operations the Trainer
// needs, behind one interface, so the transport is a choice made at start-up and not in the training loop.
//
//   Communicator          rank(), size(), allreduce_sum over float / double, broadcast of bytes, barrier, abort
//   SingleProcess         one rank: every collective is a no-op (what a run without mpirun uses)
//   MpiCommunicator       MPI (OpenMPI is what is tested); compiled only where MOM_HAVE_MPI is defined
//                         (CMake: MOM_MPI=AUTO|ON|OFF), so the header-only library needs no MPI
//   make_communicator()   MPI when the process was started by an MPI launcher and the build has MPI, else
//                         SingleProcess; a launcher's job of several ranks without MPI in the build is refused
//                         (N processes training alone would overwrite each other's checkpoints)
//   check_replicas()      parameters identical on every rank? (XXH64 per tensor; names the first that differs)
//   CollectiveWatchdog    the collective timeout: a collective waiting longer ends the process (a stopped rank)
//
// Exactness. allreduce_sum gives every rank the same bits, and the same bits every run: rank s sums shard s of
// the buffer over ranks in rank order 0, 1, ..., N-1 (MPI_Alltoallv brings the shard from every rank), then the
// shards are gathered back (MPI_Allgatherv). MPI_Allreduce leaves the order of the additions to the library
// (it may differ with message size and between ranks' shards), which would break bit-identical repeats.
// The traffic per rank is the same as a ring all-reduce's: 2 (N-1)/N of the buffer.
//
// A GPU backend's gradients are summed in device memory by NcclCommunicator (train/nccl.hpp), or, without NCCL,
// staged through host memory here (the Trainer copies them with to_host / from_host).
#pragma once

#include <mom/core/check.hpp>
#include <mom/core/layout.hpp>
#include <mom/train/checksum.hpp>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <condition_variable>
#include <cstddef>
#include <cstdio>
#include <mutex>
#include <thread>
#include <cstdint>
#include <cstdlib>
#include <memory>
#include <span>
#include <string>
#include <type_traits>
#include <vector>

#ifdef MOM_HAVE_MPI
#include <mpi.h>
#endif

namespace mom::train {

class Communicator {
 public:
  virtual ~Communicator() = default;
  virtual int rank() const = 0;
  virtual int size() const = 0;
  virtual std::string name() const = 0;  // "single process", "MPI (Open MPI v4.1.4), 2 ranks"
  // In place: x = the element-wise sum of every rank's x, the same bits on every rank (rank-order sums).
  virtual void allreduce_sum(std::span<float> x) = 0;
  virtual void allreduce_sum(std::span<double> x) = 0;
  // A communicator over device memory (train/nccl.hpp: NCCL) sums a device backend's float buffer in place with
  // allreduce_sum_device, on that backend's stream, with the same rank-order bits; the others reduce host memory
  // only (the Trainer then stages device buffers through the host).
  virtual bool reduces_device_memory() const { return false; }
  virtual void allreduce_sum_device(std::span<float>) {
    MOM_CHECK(false, "communicator '", name(), "' does not reduce device memory");
  }
  // In place: every rank's bytes become root's (the same length on every rank).
  virtual void broadcast(std::span<std::byte> bytes, int root) = 0;
  virtual void barrier() = 0;
  // Ends every rank of the job with this exit status (after an error on one rank, so the others do not
  // wait forever in the next collective).
  [[noreturn]] virtual void abort(int status) = 0;
  // A collective that waits longer than `seconds` for the other ranks ends this process with a message on
  // stderr and exit status 75 (the launcher then ends the job): a rank that stopped (SIGSTOP, a debugger, a
  // hung file system) would otherwise leave the others waiting for ever. 0: no limit (the default). Only
  // communicators with peers watch (MpiCommunicator; NcclCommunicator's host collectives through it).
  virtual void set_collective_timeout(double /*seconds*/) {}

  // root's string on every rank.
  std::string broadcast_string(std::string s, int root) {
    double n = rank() == root ? double(s.size()) : 0.0;
    allreduce_sum(std::span<double>(&n, 1));  // root's length (the others add 0)
    s.resize(std::size_t(n));
    broadcast(std::as_writable_bytes(std::span<char>(s.data(), s.size())), root);
    return s;
  }
};

class SingleProcess final : public Communicator {
 public:
  int rank() const override { return 0; }
  int size() const override { return 1; }
  std::string name() const override { return "single process"; }
  void allreduce_sum(std::span<float>) override {}
  void allreduce_sum(std::span<double>) override {}
  void broadcast(std::span<std::byte>, int) override {}
  void barrier() override {}
  [[noreturn]] void abort(int status) override { std::exit(status); }
};

// The number of processes of the job an MPI launcher started this one in (mpirun / mpiexec of Open MPI,
// MPICH's Hydra, Slurm's PMI), from the environment they set; 0 when no launcher started it.
inline int launcher_world_size() {
  for (const char* var : {"OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "PMIX_SIZE"})
    if (const char* v = std::getenv(var); v && *v) return std::atoi(v);
  return 0;
}

// This process's rank among the processes of its job on the same host (Open MPI, MPICH's Hydra, Slurm), from
// the environment the launcher sets; -1 when no launcher started it. mom-train --device cuda gives each local
// rank its own GPU with it.
inline int launcher_local_rank() {
  for (const char* var : {"OMPI_COMM_WORLD_LOCAL_RANK", "MPI_LOCALRANKID", "PMI_LOCAL_RANK", "SLURM_LOCALID"})
    if (const char* v = std::getenv(var); v && *v) return std::atoi(v);
  return -1;
}

// The collective timeout (Communicator::set_collective_timeout): a thread that wakes a few times a second
// while a limit is set and ends the process when one collective has been in progress longer than it. The
// communicator marks each collective with watch("allreduce") (a scope); the thread never calls MPI, it
// writes one line to stderr and calls std::_Exit, which MPI launchers answer by ending the job.
class CollectiveWatchdog {
 public:
  static constexpr int exit_status = 75;  // EX_TEMPFAIL: a peer, not this process, failed

  explicit CollectiveWatchdog(int rank) : rank_(rank) {}
  ~CollectiveWatchdog() {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      quit_ = true;
    }
    wake_.notify_all();
    if (thread_.joinable()) thread_.join();
  }
  CollectiveWatchdog(const CollectiveWatchdog&) = delete;
  CollectiveWatchdog& operator=(const CollectiveWatchdog&) = delete;

  void set_timeout(double seconds) {
    MOM_CHECK(std::isfinite(seconds) && seconds >= 0, "collective timeout ", seconds, " s must be >= 0 (0: none)");
    timeout_.store(seconds);
    if (seconds > 0 && !thread_.joinable()) thread_ = std::thread([this] { loop(); });
  }
  double timeout() const { return timeout_.load(); }

  // Marks a collective in progress for as long as it lives.
  class Scope {
   public:
    Scope(CollectiveWatchdog& w, const char* what) : w_(w) {
      w_.what_.store(what);
      w_.since_ns_.store(now_ns());
    }
    ~Scope() { w_.since_ns_.store(0); }
    Scope(const Scope&) = delete;
    Scope& operator=(const Scope&) = delete;

   private:
    CollectiveWatchdog& w_;
  };
  Scope watch(const char* what) { return Scope(*this, what); }

 private:
  static std::int64_t now_ns() {
    return std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now().time_since_epoch())
        .count();
  }
  void loop() {
    std::unique_lock<std::mutex> lock(mutex_);
    while (!quit_) {
      const double limit = timeout_.load();
      wake_.wait_for(lock, std::chrono::duration<double>(std::clamp(limit / 10, 0.05, 1.0)));
      const std::int64_t since = since_ns_.load();
      if (quit_ || limit <= 0 || since == 0) continue;
      const double waited = double(now_ns() - since) * 1e-9;
      if (waited <= limit) continue;
      std::fprintf(stderr,
                   "mom: rank %d: an MPI collective (%s) has waited %.1f s for the other ranks, longer than the "
                   "collective timeout of %g s (a rank stopped or hung?); ending this rank, and with it the job\n",
                   rank_, what_.load(), waited, limit);
      std::fflush(stderr);
      std::_Exit(exit_status);
    }
  }

  int rank_;
  std::atomic<double> timeout_{0};
  std::atomic<std::int64_t> since_ns_{0};  // when the collective in progress began; 0: none
  std::atomic<const char*> what_{""};
  std::mutex mutex_;
  std::condition_variable wake_;
  bool quit_ = false;
  std::thread thread_;
};

#ifdef MOM_HAVE_MPI
// MPI_COMM_WORLD. Initialises MPI (threads: funneled — only the main thread calls MPI; OpenMP works inside the
// ops) and finalises it on destruction. MPI's default error handler (errors are fatal) stays: a failed
// collective, or a peer that died, ends the job instead of returning into a training loop that cannot go on.
class MpiCommunicator final : public Communicator {
 public:
  MpiCommunicator(int* argc, char*** argv) {
    int initialised = 0;
    MPI_Initialized(&initialised);
    if (!initialised) {
      int provided = 0;
      MPI_Init_thread(argc, argv, MPI_THREAD_FUNNELED, &provided);
      owns_ = true;
    }
    MPI_Comm_rank(MPI_COMM_WORLD, &rank_);
    MPI_Comm_size(MPI_COMM_WORLD, &size_);
    watchdog_ = std::make_unique<CollectiveWatchdog>(rank_);
  }
  ~MpiCommunicator() override {
    if (owns_) MPI_Finalize();
  }
  MpiCommunicator(const MpiCommunicator&) = delete;
  MpiCommunicator& operator=(const MpiCommunicator&) = delete;

  int rank() const override { return rank_; }
  int size() const override { return size_; }
  std::string name() const override {
    char version[MPI_MAX_LIBRARY_VERSION_STRING] = {};
    int len = 0;
    MPI_Get_library_version(version, &len);
    std::string v(version, std::size_t(len));
    v = v.substr(0, v.find_first_of(",\n"));  // "Open MPI v4.1.4, package: ..." -> "Open MPI v4.1.4"
    return "MPI (" + v + "), " + std::to_string(size_) + (size_ == 1 ? " rank" : " ranks");
  }
  void allreduce_sum(std::span<float> x) override { reduce(x, MPI_FLOAT); }
  void allreduce_sum(std::span<double> x) override { reduce(x, MPI_DOUBLE); }
  void broadcast(std::span<std::byte> bytes, int root) override {
    const auto watched = watchdog_->watch("broadcast");
    for (std::size_t at = 0; at < bytes.size(); at += max_count) {
      const std::size_t n = std::min(max_count, bytes.size() - at);
      MPI_Bcast(bytes.data() + at, int(n), MPI_BYTE, root, MPI_COMM_WORLD);
    }
  }
  void barrier() override {
    const auto watched = watchdog_->watch("barrier");
    MPI_Barrier(MPI_COMM_WORLD);
  }
  void set_collective_timeout(double seconds) override { watchdog_->set_timeout(seconds); }
  [[noreturn]] void abort(int status) override {
    MPI_Abort(MPI_COMM_WORLD, status);
    std::exit(status);  // MPI_Abort does not return; this keeps [[noreturn]] honest
  }

 private:
  static constexpr std::size_t max_count = std::size_t(1) << 28;  // elements per round: MPI counts are int

  // Reduce-scatter (all-to-all of shards, each summed in rank order) then all-gather, in rounds of at most
  // max_count elements, so the scratch stays bounded and every count fits an int.
  template <class T>
  void reduce(std::span<T> all, MPI_Datatype type) {
    if (size_ == 1) return;
    const auto watched = watchdog_->watch("allreduce");
    const auto n_ranks = std::size_t(size_);
    std::vector<int> counts(n_ranks), displs(n_ranks), recv_counts(n_ranks), recv_displs(n_ranks);
    for (std::size_t at = 0; at < all.size(); at += max_count) {
      const std::span<T> x = all.subspan(at, std::min(max_count, all.size() - at));
      const std::size_t n = x.size();
      for (std::size_t r = 0; r < n_ranks; ++r) {  // shard r: [r n / N, (r + 1) n / N)
        displs[r] = int(r * n / n_ranks);
        counts[r] = int((r + 1) * n / n_ranks) - displs[r];
      }
      const auto me = std::size_t(rank_);
      const int mine = counts[me];
      for (std::size_t r = 0; r < n_ranks; ++r) recv_counts[r] = mine, recv_displs[r] = int(r) * mine;
      scratch<T>().resize(n_ranks * std::size_t(mine));
      T* in = scratch<T>().data();
      MPI_Alltoallv(x.data(), counts.data(), displs.data(), type, in, recv_counts.data(), recv_displs.data(), type,
                    MPI_COMM_WORLD);
      T* out = x.data() + displs[me];
      for (int i = 0; i < mine; ++i) out[i] = in[i];  // rank 0's part, then ranks 1, 2, ... added in order
      for (std::size_t r = 1; r < n_ranks; ++r) {
        const T* part = in + r * std::size_t(mine);
        for (int i = 0; i < mine; ++i) out[i] += part[i];
      }
      MPI_Allgatherv(MPI_IN_PLACE, 0, type, x.data(), counts.data(), displs.data(), type, MPI_COMM_WORLD);
    }
  }
  template <class T>
  std::vector<T>& scratch() {
    if constexpr (std::is_same_v<T, float>) return scratch_f_;
    else return scratch_d_;
  }

  int rank_ = 0, size_ = 1;
  bool owns_ = false;
  std::unique_ptr<CollectiveWatchdog> watchdog_;
  std::vector<float> scratch_f_;
  std::vector<double> scratch_d_;
};
#endif

// The communicator of this process: MPI when an MPI launcher started it (and the build has MPI), else a single
// process. A launcher's job of several ranks in a build without MPI is refused: each process would train the
// whole model alone and write the same checkpoints.
inline std::unique_ptr<Communicator> make_communicator([[maybe_unused]] int* argc, [[maybe_unused]] char*** argv) {
  const int launched = launcher_world_size();
#ifdef MOM_HAVE_MPI
  if (launched > 0) return std::make_unique<MpiCommunicator>(argc, argv);
#else
  MOM_CHECK(launched <= 1, "started by an MPI launcher as one of ", launched,
            " processes, but this build has no MPI (configure with OpenMPI installed, or -DMOM_MPI=ON)");
#endif
  return std::make_unique<SingleProcess>();
}

// Checks that every rank holds the same parameters (data-parallel replicas must: they apply the same update to
// the same values). Each rank hashes every layout tensor of its host copy of the parameters (XXH64), rank 0's
// hashes are broadcast, and the ranks count, per tensor, how many of them differ; a difference anywhere is an
// error on every rank that names the first tensor that differs. Hashing runs at several GB/s on one core.
template <class T>
void check_replicas(Communicator& comm, std::span<const ParamInfo> layout, std::span<const T> params, long long step) {
  if (comm.size() == 1) return;
  std::vector<std::uint64_t> ours(layout.size());
  for (std::size_t i = 0; i < layout.size(); ++i)
    ours[i] = checksum::xxh64(params.data() + layout[i].offset, std::size_t(layout[i].size()) * sizeof(T));
  std::vector<std::uint64_t> root = ours;
  comm.broadcast(std::as_writable_bytes(std::span<std::uint64_t>(root)), 0);
  std::vector<double> differ(layout.size());
  for (std::size_t i = 0; i < layout.size(); ++i) differ[i] = ours[i] != root[i] ? 1.0 : 0.0;
  comm.allreduce_sum(std::span<double>(differ));
  for (std::size_t i = 0; i < layout.size(); ++i)
    MOM_CHECK(differ[i] == 0, "the data-parallel replicas diverged at step ", step, ": parameter tensor '",
              layout[i].name, "' differs from rank 0's on ", differ[i], " of ", comm.size(),
              " ranks (first differing tensor in layout order)");
}

}  // namespace mom::train
