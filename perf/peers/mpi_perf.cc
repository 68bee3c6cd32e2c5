// mpi_perf: loom's perf table for MPI's own collectives (MPI_Allreduce, MPI_Reduce_scatter_block,
// MPI_Allgather, MPI_Bcast, MPI_Alltoall), so that tools/compare-peers can set an MPI beside loom. Run it the way
// a user runs MPI, with the library's default settings: `mpirun -n 2 mpi_perf -C all_reduce -b 8 -e 256M -f 2`.
// It links loom only for the check data. MPI has no half or bfloat16 type and no avg operator; counts above
// INT_MAX elements are refused (MPI-3's int counts).
#include <mpi.h>

#include <climits>
#include <cstdio>
#include <cstring>
#include <string>

#include "perf/check_data.h"
#include "perf/peers/peer_harness.h"

namespace {

MPI_Datatype mpiType(loomDataType_t type) {
  switch (type) {
    case loomInt8:
      return MPI_INT8_T;
    case loomUint8:
      return MPI_UINT8_T;
    case loomInt32:
      return MPI_INT32_T;
    case loomUint32:
      return MPI_UINT32_T;
    case loomInt64:
      return MPI_INT64_T;
    case loomUint64:
      return MPI_UINT64_T;
    case loomFloat32:
      return MPI_FLOAT;
    case loomFloat64:
      return MPI_DOUBLE;
    default:
      return MPI_DATATYPE_NULL;
  }
}

MPI_Op mpiOp(loomRedOp_t op) {
  switch (op) {
    case loomSum:
      return MPI_SUM;
    case loomProd:
      return MPI_PROD;
    case loomMax:
      return MPI_MAX;
    case loomMin:
      return MPI_MIN;
    default:
      return MPI_OP_NULL;
  }
}

class MpiBackend : public perf::PeerBackend {
 public:
  MpiBackend() {
    MPI_Comm_rank(MPI_COMM_WORLD, &rank_);
    MPI_Comm_size(MPI_COMM_WORLD, &nranks_);
  }

  std::string description() const override {
    char version[MPI_MAX_LIBRARY_VERSION_STRING] = {};
    int length = 0;
    MPI_Get_library_version(version, &length);
    std::string text(version, length);
    size_t end = text.find_first_of("\r\n");
    return text.substr(0, end);  // the first line names library and version
  }
  int rank() const override { return rank_; }
  int nranks() const override { return nranks_; }

  std::string unsupported(perf::Collective collective, loomDataType_t type, loomRedOp_t op) const override {
    if (mpiType(type) == MPI_DATATYPE_NULL) return "MPI has no type for this datatype (half, bfloat16)";
    bool reduces = collective == perf::Collective::kAllReduce || collective == perf::Collective::kReduceScatter;
    if (reduces && mpiOp(op) == MPI_OP_NULL) return "MPI has no avg operator";
    return "";
  }

  void run(const perf::PeerCall& c) override {
    if (c.count > static_cast<size_t>(INT_MAX)) {
      fprintf(stderr, "mpi_perf: count %zu exceeds MPI's int counts\n", c.count);
      MPI_Abort(MPI_COMM_WORLD, 1);
    }
    int count = static_cast<int>(c.count);
    MPI_Datatype type = mpiType(c.type);
    switch (c.collective) {
      case perf::Collective::kAllReduce:
        MPI_Allreduce(c.send, c.recv, count, type, mpiOp(c.op), MPI_COMM_WORLD);
        break;
      case perf::Collective::kReduceScatter:
        MPI_Reduce_scatter_block(c.send, c.recv, count, type, mpiOp(c.op), MPI_COMM_WORLD);
        break;
      case perf::Collective::kAllGather:
        MPI_Allgather(c.send, count, type, c.recv, count, type, MPI_COMM_WORLD);
        break;
      case perf::Collective::kBroadcast: {
        // MPI_Bcast works in one buffer, loom's Broadcast out of place: the root sends from its send buffer and
        // then copies it to its receive buffer, the copy an out-of-place broadcast makes, timed with the call.
        void* buffer = rank_ == c.root ? const_cast<void*>(c.send) : c.recv;
        MPI_Bcast(buffer, count, type, c.root, MPI_COMM_WORLD);
        if (rank_ == c.root) memcpy(c.recv, c.send, c.count * perf::typeSize(c.type));
        break;
      }
      case perf::Collective::kAllToAll:
        MPI_Alltoall(c.send, count, type, c.recv, count, type, MPI_COMM_WORLD);
        break;
      default:
        MPI_Abort(MPI_COMM_WORLD, 1);
    }
  }

  void barrier() override { MPI_Barrier(MPI_COMM_WORLD); }

  double sumOverRanks(double value) override {
    double sum = 0;
    MPI_Allreduce(&value, &sum, 1, MPI_DOUBLE, MPI_SUM, MPI_COMM_WORLD);
    return sum;
  }

 private:
  int rank_ = 0, nranks_ = 1;
};

}  // namespace

int main(int argc, char** argv) {
  MPI_Init(&argc, &argv);
  int status;
  {
    MpiBackend backend;
    status = perf::runPeerTest(argc, argv, backend);
  }
  MPI_Finalize();
  return status;
}
