// Data parallelism over GPUs: a train::Communicator whose gradient sums run in device memory through NCCL
// (docs/distributed.md, "On GPUs"). Compiled only where MOM_HAVE_NCCL is defined (CMake: MOM_NCCL=AUTO|ON|OFF,
// which needs the CUDA backend and MPI); mom-train --device cuda under mpirun uses it.
//
//   NcclCommunicator(host, be)   host: the process group (MPI) that started the ranks; be: this rank's CUDA backend
//                                (its stream orders the reduction with the training step: no host wait)
//
// Exactness. allreduce_sum_device gives every rank the same bits, and the same bits as the MPI communicator's
// host-staged reduction (train/distributed.hpp): element i is x_0[i] + x_1[i] + ... + x_{N-1}[i], added in rank
// order. The buffer is cut into N equal shards (the last padded with zeros); an all-to-all (grouped ncclSend /
// ncclRecv) brings shard r of every rank to rank r, which adds them in rank order (one copy, then N-1 axpy with
// a = 1: each an exactly rounded addition), and ncclAllGather returns the summed shards to every rank. NCCL's own
// ncclAllReduce leaves the order of the additions to its algorithm (ring, tree; it can change with the message
// size and the topology), which would break bit-identical replicas and repeats. The traffic per rank is a ring
// all-reduce's, 2 (N-1)/N of the buffer; the work runs in rounds of at most `bucket` elements, so the scratch
// (two padded copies of one round) stays bounded.
//
// The host collectives the Trainer also needs (the loss, the stop request, statistics, broadcasts, the replica
// check) are the host communicator's.
#pragma once

#ifndef MOM_HAVE_NCCL
#error "mom/train/nccl.hpp needs NCCL (CMake: MOM_NCCL=AUTO|ON finds it in the CUDA toolkit; defines MOM_HAVE_NCCL)"
#endif

#include <nccl.h>

#include <algorithm>
#include <cstring>
#include <span>
#include <string>

#include <mom/backend/cuda.hpp>
#include <mom/train/distributed.hpp>

#define MOM_NCCL_CHECK(call, op)                                                                              \
  do {                                                                                                        \
    const ncclResult_t mom_nccl_res_ = (call);                                                                \
    if (mom_nccl_res_ != ncclSuccess) [[unlikely]]                                                            \
      ::mom::detail::fail(op, ": ", #call, " failed: ", ncclGetErrorString(mom_nccl_res_));                   \
  } while (0)

namespace mom::train {

class NcclCommunicator final : public Communicator {
 public:
  static constexpr std::size_t bucket = std::size_t(1) << 25;  // elements per round (128 MiB of floats)

  NcclCommunicator(Communicator& host, const cuda::Backend<float>& be) : host_(host), be_(be) {
    ncclUniqueId id{};
    if (host_.rank() == 0) MOM_NCCL_CHECK(ncclGetUniqueId(&id), "NcclCommunicator");
    host_.broadcast(std::as_writable_bytes(std::span<char>(id.internal, sizeof id.internal)), 0);
    MOM_CUDA_CHECK(cudaSetDevice(be_.device()), "NcclCommunicator");
    MOM_NCCL_CHECK(ncclCommInitRank(&comm_, host_.size(), id, host_.rank()), "NcclCommunicator");
  }
  ~NcclCommunicator() override {
    if (comm_) (void)ncclCommDestroy(comm_);
  }
  NcclCommunicator(const NcclCommunicator&) = delete;
  NcclCommunicator& operator=(const NcclCommunicator&) = delete;

  int rank() const override { return host_.rank(); }
  int size() const override { return host_.size(); }
  std::string name() const override {
    int v = 0;
    (void)ncclGetVersion(&v);
    return "NCCL " + std::to_string(v / 10000) + "." + std::to_string(v / 100 % 100) + "." + std::to_string(v % 100) +
           " (device memory) over " + host_.name();
  }
  void allreduce_sum(std::span<float> x) override { host_.allreduce_sum(x); }
  void allreduce_sum(std::span<double> x) override { host_.allreduce_sum(x); }
  void broadcast(std::span<std::byte> bytes, int root) override { host_.broadcast(bytes, root); }
  void barrier() override { host_.barrier(); }
  void set_collective_timeout(double seconds) override { host_.set_collective_timeout(seconds); }
  [[noreturn]] void abort(int status) override {
    if (comm_) (void)ncclCommAbort(comm_);
    comm_ = nullptr;
    host_.abort(status);
  }

  bool reduces_device_memory() const override { return true; }
  // In place over the backend's device memory, enqueued on its stream (the host does not wait).
  void allreduce_sum_device(std::span<float> x) override {
    const auto n_ranks = std::size_t(size());
    if (n_ranks == 1) return;
    for (std::size_t at = 0; at < x.size(); at += bucket) {
      const std::span<float> part = x.subspan(at, std::min(bucket, x.size() - at));
      const std::size_t shard = (part.size() + n_ranks - 1) / n_ranks;
      reserve(n_ranks * shard);
      const std::span<float> padded = padded_.span().first(n_ranks * shard);
      const std::span<float> received = received_.span().first(n_ranks * shard);
      be_.zero(padded.subspan(part.size()));
      be_.copy(padded.first(part.size()), std::span<const float>(part));
      // Shard r of every rank to rank r.
      MOM_NCCL_CHECK(ncclGroupStart(), "allreduce_sum_device");
      for (std::size_t r = 0; r < n_ranks; ++r) {
        MOM_NCCL_CHECK(ncclSend(padded.data() + r * shard, shard, ncclFloat, int(r), comm_, be_.stream()),
                       "allreduce_sum_device");
        MOM_NCCL_CHECK(ncclRecv(received.data() + r * shard, shard, ncclFloat, int(r), comm_, be_.stream()),
                       "allreduce_sum_device");
      }
      MOM_NCCL_CHECK(ncclGroupEnd(), "allreduce_sum_device");
      // This rank's shard: rank 0's part, then ranks 1, 2, ... added in order.
      const std::span<float> mine = padded.subspan(std::size_t(rank()) * shard, shard);
      be_.copy(mine, std::span<const float>(received.first(shard)));
      for (std::size_t r = 1; r < n_ranks; ++r)
        be_.axpy(mine, 1.0f, std::span<const float>(received.subspan(r * shard, shard)));
      MOM_NCCL_CHECK(ncclAllGather(mine.data(), padded.data(), shard, ncclFloat, comm_, be_.stream()),
                     "allreduce_sum_device");
      be_.copy(part, std::span<const float>(padded.first(part.size())));
    }
  }

 private:
  // Scratch for one round, grown on the first reduction (the Trainer's first step), never inside a later one.
  void reserve(std::size_t n) {
    if (std::size_t(padded_.size()) >= n) return;
    padded_ = be_.alloc<float>(index_t(n));
    received_ = be_.alloc<float>(index_t(n));
  }

  Communicator& host_;
  cuda::Backend<float> be_;  // shares the training backend's stream
  ncclComm_t comm_ = nullptr;
  cuda::Buffer<float> padded_, received_;
};

}  // namespace mom::train
