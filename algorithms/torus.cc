// Torus algorithms: the ranks form a k-dimensional torus (CollArgs::torusDims, from LOOM_TORUS_DIMS; row-major,
// the last dimension varying fastest; a near-square 2-D grid when none is given), and AllReduce, ReduceScatter
// and AllGather run as bidirectional rings along one dimension at a time, as on TPU pods: the grid algorithms
// (grid.cc) with dimension 0 as the first level. A rank's ring in dimension d is the ranks that share all its
// other coordinates. Rings along a dimension of size n_d take n_d - 1 steps instead of the n - 1 of one ring
// over all ranks, and all rings of a dimension run at once on disjoint links.
// Steps per lane: AllReduce 2 sum(n_d - 1), the others sum(n_d - 1) rings (one message per block of a chunk);
// bytes sent per rank as in the ring: 2 (n-1)/n of the data for AllReduce, (n-1)/n for the others.
#include <string>
#include <vector>

#include "algorithms/grid.h"

namespace loom {
namespace {

Grid torusOf(const CollArgs& args) {
  std::vector<int> dims(args.torusDims, args.torusDims + args.torusDimCount);
  if (dims.empty()) {
    int rows = 1;
    for (int a = 1; a * a <= args.nranks; ++a)
      if (args.nranks % a == 0) rows = a;
    dims = {rows, args.nranks / rows};
  }
  std::vector<int> coords;
  for (int r = 0; r < args.nranks; ++r) {
    int stride = args.nranks;
    for (int size : dims) {
      stride /= size;
      coords.push_back(r / stride % size);
    }
  }
  return Grid(dims, coords);
}

}  // namespace

bool parseTorusDims(const std::string& text, int nranks, int dims[kMaxTorusDims], int* count, std::string* error) {
  *count = 0;
  long product = 1;
  for (size_t start = 0; start <= text.size();) {
    size_t end = text.find_first_of("xX", start);
    if (end == std::string::npos) end = text.size();
    std::string item = text.substr(start, end - start);
    bool digits = !item.empty() && item.size() <= 6 && item.find_first_not_of("0123456789") == std::string::npos;
    if (!digits || std::stol(item) < 1) {
      *error = "\"" + item + "\" is not a dimension size (sizes are positive integers separated by 'x', e.g. 4x4x2)";
      return false;
    }
    if (*count == kMaxTorusDims) {
      *error = "more than " + std::to_string(kMaxTorusDims) + " dimensions";
      return false;
    }
    dims[(*count)++] = static_cast<int>(std::stol(item));
    product *= dims[*count - 1];
    if (product > nranks) break;
    start = end + 1;
  }
  if (product != nranks) {
    *error = "the sizes multiply to " + std::string(product > nranks ? "more than " : "") + std::to_string(product) +
             ", not to the " + std::to_string(nranks) + " ranks";
    return false;
  }
  return true;
}

RankPlan buildTorusAllReduce(const CollArgs& args) { return gridAllReduce(args, torusOf(args), "torus"); }
RankPlan buildTorusReduceScatter(const CollArgs& args) { return gridReduceScatter(args, torusOf(args), "torus"); }
RankPlan buildTorusAllGather(const CollArgs& args) { return gridAllGather(args, torusOf(args), "torus"); }

}  // namespace loom
