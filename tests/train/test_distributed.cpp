// Data parallelism's pieces that need no MPI (train/distributed.hpp, data.hpp): the sampler's split of the
// windows by rank, the replica check against a scripted peer, the single-process communicator. The Trainer
// across real ranks is tested under mpirun by examples/test_mpi.sh.
#include <catch2/catch.hpp>

#include <mom/train/data.hpp>
#include <mom/train/distributed.hpp>

#include "helpers.hpp"

#include <array>
#include <cstdlib>
#include <cstring>
#include <sys/wait.h>
#include <thread>
#include <unistd.h>

using namespace mom;
using namespace mom::train;

namespace {

// Rank `me` of `ranks`, whose peers are scripted: broadcasts deliver `root_bytes`, and a sum adds `others`
// (what the other ranks contribute) when given, else nothing.
struct ScriptedPeer final : Communicator {
  int me = 1, ranks = 2;
  std::vector<std::byte> root_bytes;
  std::vector<double> others;
  int rank() const override { return me; }
  int size() const override { return ranks; }
  std::string name() const override { return "scripted"; }
  void allreduce_sum(std::span<float>) override {}
  void allreduce_sum(std::span<double> x) override {
    for (std::size_t i = 0; i < others.size() && i < x.size(); ++i) x[i] += others[i];
  }
  void broadcast(std::span<std::byte> bytes, int) override {
    REQUIRE(root_bytes.size() == bytes.size());
    std::memcpy(bytes.data(), root_bytes.data(), bytes.size());
  }
  void barrier() override {}
  [[noreturn]] void abort(int) override { throw std::logic_error("abort"); }
};

constexpr std::array<ParamInfo, 3> layout{ParamInfo{"wte", 4, 2, 0}, ParamInfo{"h.0.attn.w_qkv", 2, 3, 8},
                                          ParamInfo{"ln_f.w", 1, 2, 14}};

std::vector<std::byte> hashes_of(std::span<const float> params) {
  std::vector<std::uint64_t> h;
  for (const auto& p : layout) h.push_back(checksum::xxh64(params.data() + p.offset, std::size_t(p.size()) * 4));
  const auto bytes = std::as_bytes(std::span<const std::uint64_t>(h));
  return {bytes.begin(), bytes.end()};
}

}  // namespace

TEST_CASE("BatchSampler split by rank: the ranks' windows are one process's batch of ranks x batch", "[data][rng][distributed]") {
  mom_test::TempDir dir("sampler_ranks");
  std::vector<token_t> tokens(5000);
  for (std::size_t i = 0; i < tokens.size(); ++i) tokens[i] = token_t((i * 7919 + i / 13) % 256);
  write_token_file(dir / "t.bin", tokens, 256, "byte");
  TokenFile f(dir / "t.bin");
  const index_t b = 3, seq = 16;
  for (const int ranks : {2, 3}) {
    BatchSampler whole(f, b * ranks, seq, 42);
    std::vector<BatchSampler> parts;
    for (int r = 0; r < ranks; ++r) parts.emplace_back(f, b, seq, 42, r, ranks);
    for (int step = 0; step < 4; ++step) {
      std::vector<token_t> in(std::size_t(b * ranks * seq)), tg(in.size());
      whole.next(in, tg);
      for (int r = 0; r < ranks; ++r) {
        std::vector<token_t> pin(std::size_t(b * seq)), ptg(pin.size());
        parts[std::size_t(r)].next(pin, ptg);
        const auto at = std::size_t(r * b * seq);
        CHECK(std::equal(pin.begin(), pin.end(), in.begin() + std::ptrdiff_t(at)));
        CHECK(std::equal(ptg.begin(), ptg.end(), tg.begin() + std::ptrdiff_t(at)));
        CHECK(parts[std::size_t(r)].state() == whole.state());  // every rank's RNG in step: one state to save
      }
    }
  }
  CHECK_THROWS_WITH(BatchSampler(f, b, seq, 1, 2, 2), Catch::Contains("rank 2 of 2"));
}

TEST_CASE("check_replicas names the first tensor that differs from rank 0's", "[distributed]") {
  std::vector<float> root(16), mine(16);
  for (std::size_t i = 0; i < root.size(); ++i) root[i] = mine[i] = float(i) * 0.25f - 1.0f;
  ScriptedPeer peer;
  peer.root_bytes = hashes_of(root);
  const std::span<const ParamInfo> L(layout);
  check_replicas(peer, L, std::span<const float>(mine), 7);  // identical: no error

  mine[9] = std::nextafter(mine[9], 10.0f);  // one ulp in h.0.attn.w_qkv
  mine[15] += 1.0f;                          // and in ln_f.w
  CHECK_THROWS_WITH(check_replicas(peer, L, std::span<const float>(mine), 7),
                    Catch::Contains("diverged at step 7: parameter tensor 'h.0.attn.w_qkv' differs from rank 0's on 1 "
                                    "of 2 ranks"));
  // A tensor that differs on another rank only: every rank reports it (the counts are summed).
  std::copy(root.begin(), root.end(), mine.begin());
  peer.others = {0.0, 0.0, 1.0};
  CHECK_THROWS_WITH(check_replicas(peer, L, std::span<const float>(mine), 8), Catch::Contains("'ln_f.w'"));
}

TEST_CASE("one process: SingleProcess collectives change nothing, no launcher means no MPI", "[distributed]") {
  SingleProcess one;
  CHECK(one.rank() == 0);
  CHECK(one.size() == 1);
  std::vector<float> x{1.5f, -2.0f};
  one.allreduce_sum(std::span<float>(x));
  CHECK(x == std::vector<float>{1.5f, -2.0f});
  CHECK(one.broadcast_string("abc", 0) == "abc");
  // check_replicas with one rank: nothing to compare, never an error.
  const std::vector<float> p(16, 1.0f);
  check_replicas(one, std::span<const ParamInfo>(layout), std::span<const float>(p), 0);
  if (launcher_world_size() == 0) {
    int argc = 0;
    char** argv = nullptr;
    CHECK(make_communicator(&argc, &argv)->size() == 1);
#ifndef MOM_HAVE_MPI
    // Started by mpirun as one of two processes, a build without MPI refuses (each would train alone).
    ::setenv("OMPI_COMM_WORLD_SIZE", "2", 1);
    CHECK_THROWS_WITH(make_communicator(&argc, &argv), Catch::Contains("one of 2 processes, but this build has no MPI"));
    ::unsetenv("OMPI_COMM_WORLD_SIZE");
#endif
  }
}

TEST_CASE("the collective timeout ends a process whose collective waits too long, and only then", "[distributed]") {
  // In a child process: the watchdog calls std::_Exit, which must not end the test runner.
  auto exit_status = [](double timeout, double collective_seconds, double outside_seconds) {
    std::fflush(nullptr);
    const pid_t pid = ::fork();
    REQUIRE(pid >= 0);
    if (pid == 0) {
      {
        CollectiveWatchdog w(3);
        w.set_timeout(timeout);
        {
          const auto watched = w.watch("allreduce");
          std::this_thread::sleep_for(std::chrono::duration<double>(collective_seconds));
        }
        std::this_thread::sleep_for(std::chrono::duration<double>(outside_seconds));  // no collective: no limit
      }
      std::_Exit(0);
    }
    int status = 0;
    REQUIRE(::waitpid(pid, &status, 0) == pid);
    return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  };
  CHECK(exit_status(0.2, 1.5, 0) == CollectiveWatchdog::exit_status);  // waits past the limit
  CHECK(exit_status(0.5, 0.1, 1.0) == 0);  // a short collective, then a long pause outside any
  CHECK(exit_status(0, 0.3, 0) == 0);      // no limit
  CollectiveWatchdog w(0);
  CHECK_THROWS_WITH(w.set_timeout(-1), Catch::Contains("collective timeout -1 s must be >= 0"));
  SingleProcess one;
  one.set_collective_timeout(1);  // nothing to wait for: accepted, no thread
}
