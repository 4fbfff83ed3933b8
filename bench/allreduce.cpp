// bench_allreduce: time of train::MpiCommunicator::allreduce_sum (the Trainer's gradient reduction: rank-order
// sums, all-to-all + all-gather) against the buffer size, and of MPI_Allreduce for comparison, to fit the
// latency alpha and bandwidth beta of docs/distributed.md's cost model. Rank 0 prints one line per size.
//
//   mpirun -np 2 build/bench/bench_allreduce [floats ...]     sizes 1, 4, ..., 4^12, then the given sizes
//                                                            (bench/RESULTS.md)
#include <mom/train/distributed.hpp>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <string>
#include <vector>

int main(int argc, char** argv) {
  using clock = std::chrono::steady_clock;
  mom::train::MpiCommunicator comm(&argc, &argv);
  if (comm.rank() == 0) std::printf("%s\n%12s %12s %14s %14s %14s\n", comm.name().c_str(), "floats", "bytes",
                                    "ours (us)", "MPI_Allreduce", "ours GB/s*");
  // dense8's and mom8-p's gradient sizes are in the range (6.4M and 7.2M floats); pass them to time them exactly.
  std::vector<std::size_t> sizes;
  for (std::size_t n = 1; n <= (std::size_t(1) << 24); n *= 4) sizes.push_back(n);
  for (int i = 1; i < argc; ++i) sizes.push_back(std::size_t(std::stoull(argv[i])));
  for (const std::size_t n : sizes) {
    std::vector<float> x(n, 0.0f);  // zeros stay zeros: no overflow over the repetitions
    const int reps = int(std::clamp<std::size_t>((std::size_t(1) << 26) / (n + 1024), 3, 2000));
    auto time = [&](auto&& reduce) {
      std::vector<double> best(1, 1e30);
      for (int round = 0; round < 3; ++round) {
        comm.barrier();
        const auto t0 = clock::now();
        for (int r = 0; r < reps; ++r) reduce();
        double t = std::chrono::duration<double>(clock::now() - t0).count() / reps;
        comm.allreduce_sum(std::span<double>(&t, 1));  // the slowest rank's is what a step waits for; mean here
        best[0] = std::min(best[0], t / comm.size());
      }
      return best[0];
    };
    const double ours = time([&] { comm.allreduce_sum(std::span<float>(x)); });
    const double mpi = time([&] { MPI_Allreduce(MPI_IN_PLACE, x.data(), int(n), MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD); });
    // *: bus bandwidth, 2 (N-1)/N of the buffer per rank over the time (the traffic a ring all-reduce moves)
    const double bus = 2.0 * (comm.size() - 1) / comm.size() * double(n) * 4 / ours / 1e9;
    if (comm.rank() == 0)
      std::printf("%12zu %12zu %14.1f %14.1f %14.2f\n", n, n * 4, ours * 1e6, mpi * 1e6, bus);
  }
  return 0;
}
