// NCCL's entry points that train/nccl.hpp calls, emulated over MPI for mom-train-emu (whose "device" memory is
// host memory: emu_runtime.cpp): `mpirun -np 2 mom-train-emu --device cuda` then runs NcclCommunicator's
// reduction, shard exchange and all-gather included, on a machine without GPUs (examples/test_mpi.sh). The
// communicator is MPI_COMM_WORLD (the unique id is checked to be the one rank 0 made); a group's sends and
// receives are posted together at ncclGroupEnd, as NCCL runs them, and completed before it returns (the
// emulated streams are synchronous).
#include <mpi.h>
#include <nccl.h>

#include <cstring>
#include <vector>

namespace {
constexpr char id_tag[] = "mom-emulated-nccl";
struct Pending {
  bool send;
  void* buf;
  size_t bytes;
  int peer;
};
std::vector<Pending> group;
int group_depth = 0;
bool comm_live = false;

size_t bytes_of(ncclDataType_t t) {
  switch (t) {
    case ncclFloat32: return 4;
    case ncclFloat64: return 8;
    case ncclInt32: return 4;
    case ncclInt64: return 8;
    default: return 0;
  }
}

// One message per call; counts of the tests' buffers fit an int.
ncclResult_t run_group() {
  std::vector<MPI_Request> requests(group.size());
  for (size_t i = 0; i < group.size(); ++i) {
    const Pending& p = group[i];
    if (p.bytes > size_t(1) << 30) return ncclInvalidArgument;
    if (p.send)
      MPI_Isend(p.buf, int(p.bytes), MPI_BYTE, p.peer, 77, MPI_COMM_WORLD, &requests[i]);
    else
      MPI_Irecv(p.buf, int(p.bytes), MPI_BYTE, p.peer, 77, MPI_COMM_WORLD, &requests[i]);
  }
  MPI_Waitall(int(requests.size()), requests.data(), MPI_STATUSES_IGNORE);
  group.clear();
  return ncclSuccess;
}

ncclResult_t post(bool send, const void* buf, size_t count, ncclDataType_t type, int peer) {
  if (!comm_live || bytes_of(type) == 0) return ncclInvalidArgument;
  group.push_back({send, const_cast<void*>(buf), count * bytes_of(type), peer});
  return group_depth > 0 ? ncclSuccess : run_group();
}
}  // namespace

extern "C" {

ncclResult_t ncclGetVersion(int* version) {
  *version = NCCL_VERSION_CODE;
  return ncclSuccess;
}
const char* ncclGetErrorString(ncclResult_t) { return "emulated NCCL error"; }
ncclResult_t ncclGetUniqueId(ncclUniqueId* id) {
  std::memset(id->internal, 0, sizeof id->internal);
  std::memcpy(id->internal, id_tag, sizeof id_tag);
  return ncclSuccess;
}
ncclResult_t ncclCommInitRank(ncclComm_t* comm, int nranks, ncclUniqueId id, int rank) {
  int size = 0, me = 0;
  MPI_Comm_size(MPI_COMM_WORLD, &size);
  MPI_Comm_rank(MPI_COMM_WORLD, &me);
  // Every rank must hold rank 0's id (broadcast by the caller), and the ranks must be MPI's.
  if (std::memcmp(id.internal, id_tag, sizeof id_tag) != 0 || nranks != size || rank != me) return ncclInvalidUsage;
  static int handle;
  *comm = reinterpret_cast<ncclComm_t>(&handle);
  comm_live = true;
  return ncclSuccess;
}
ncclResult_t ncclCommDestroy(ncclComm_t) {
  comm_live = false;
  return ncclSuccess;
}
ncclResult_t ncclCommAbort(ncclComm_t) {
  comm_live = false;
  return ncclSuccess;
}
ncclResult_t ncclGroupStart() {
  ++group_depth;
  return ncclSuccess;
}
ncclResult_t ncclGroupEnd() {
  if (group_depth == 0) return ncclInvalidUsage;
  return --group_depth == 0 ? run_group() : ncclSuccess;
}
ncclResult_t ncclSend(const void* buf, size_t count, ncclDataType_t type, int peer, ncclComm_t, cudaStream_t) {
  return post(true, buf, count, type, peer);
}
ncclResult_t ncclRecv(void* buf, size_t count, ncclDataType_t type, int peer, ncclComm_t, cudaStream_t) {
  return post(false, buf, count, type, peer);
}
// In place when sendbuff is recvbuff + rank * count (as NCCL allows).
ncclResult_t ncclAllGather(const void* send, void* recv, size_t count, ncclDataType_t type, ncclComm_t, cudaStream_t) {
  const size_t bytes = count * bytes_of(type);
  if (!comm_live || bytes == 0 || bytes > size_t(1) << 30) return ncclInvalidArgument;
  int me = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &me);
  char* mine = static_cast<char*>(recv) + size_t(me) * bytes;
  if (send != mine) std::memmove(mine, send, bytes);
  MPI_Allgather(MPI_IN_PLACE, 0, MPI_DATATYPE_NULL, recv, int(bytes), MPI_BYTE, MPI_COMM_WORLD);
  return ncclSuccess;
}

}  // extern "C"
