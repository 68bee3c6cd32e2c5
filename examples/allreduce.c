/* One AllReduce of floats on every rank. From the repository root, after a build:
 *   cc examples/allreduce.c -Iinclude -Lbuild -lloom -o allreduce
 *   LD_LIBRARY_PATH=build build/tools/loomrun -n 4 ./allreduce
 */
#include <stdio.h>
#include <stdlib.h>

#include "loom/loom.h"

#define N 1024
#define CHECK(call, comm) do { loomResult_t r_ = (call); if (r_ != loomSuccess) { \
    fprintf(stderr, "%s: %s: %s\n", #call, loomGetErrorString(r_), loomGetLastError(comm)); exit(1); } } while (0)

int main(void) {
  loomComm_t comm;
  int rank, nranks, wrong = 0;
  float buf[N];
  CHECK(loomCommInitFromEnv(&comm), NULL); /* rank, size and root from loomrun, torchrun, mpirun or srun */
  CHECK(loomCommUserRank(comm, &rank), comm);
  CHECK(loomCommCount(comm, &nranks), comm);
  for (int i = 0; i < N; ++i) buf[i] = (float)(rank + 1);
  CHECK(loomAllReduce(buf, buf, N, loomFloat32, loomSum, comm, NULL), comm); /* in place; NULL: blocking */
  for (int i = 0; i < N; ++i) wrong += buf[i] != nranks * (nranks + 1) / 2.0f;
  printf("rank %d of %d: %s (%g)\n", rank, nranks, wrong ? "wrong" : "ok", buf[0]);
  CHECK(loomCommDestroy(comm), NULL);
  return wrong != 0;
}
