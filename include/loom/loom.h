/*
 * loom.h — the public C API of loom, a topology-aware collective communication library.
 *
 * The shape is NCCL's with the `loom` prefix: communicators made from a unique id, collectives and
 * point-to-point calls that take a stream, groups that fuse calls. This header is the only part of loom that
 * applications, the perf suite and the plug-ins see. It says nothing about transports or algorithms.
 */
#ifndef LOOM_LOOM_H_
#define LOOM_LOOM_H_

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* The library is built with hidden visibility; everything declared here is its exported API. */
#if defined(__GNUC__)
#pragma GCC visibility push(default)
#endif

#define LOOM_MAJOR 0
#define LOOM_MINOR 1
#define LOOM_PATCH 0
/** LOOM_VERSION_CODE as returned by loomGetVersion: major * 10000 + minor * 100 + patch. */
#define LOOM_VERSION_CODE (LOOM_MAJOR * 10000 + LOOM_MINOR * 100 + LOOM_PATCH)

/** An opaque communicator: one rank's membership in a group of ranks. */
typedef struct loomComm* loomComm_t;

/**
 * Where a call is ordered. For a host communicator: NULL runs the call to completion on the calling thread;
 * a stream from loomStreamCreate queues it. For a CUDA communicator: a cudaStream_t.
 */
typedef void* loomStream_t;

#define LOOM_UNIQUE_ID_BYTES 128
/** Names one communicator being created: the root's address and a random secret. Copy it to every rank. */
typedef struct {
  char internal[LOOM_UNIQUE_ID_BYTES];
} loomUniqueId;

/** Status of every call. */
typedef enum {
  loomSuccess = 0,
  loomUnhandledCudaError = 1,
  loomSystemError = 2,
  loomInternalError = 3,
  loomInvalidArgument = 4,
  loomInvalidUsage = 5,
  loomRemoteError = 6,
  loomInProgress = 7,
  loomTimeout = 8,
  loomNumResults = 9
} loomResult_t;

/** Element types. Float16 and Bfloat16 are reduced in fp32 and rounded to nearest even. */
typedef enum {
  loomInt8 = 0,
  loomUint8 = 1,
  loomInt32 = 2,
  loomUint32 = 3,
  loomInt64 = 4,
  loomUint64 = 5,
  loomFloat16 = 6,
  loomFloat32 = 7,
  loomFloat64 = 8,
  loomBfloat16 = 9,
  loomNumTypes = 10
} loomDataType_t;

/** Reduction operators. loomAvg sums, then divides by the number of ranks (integer division for integers). */
typedef enum { loomSum = 0, loomProd = 1, loomMax = 2, loomMin = 3, loomAvg = 4, loomNumOps = 5 } loomRedOp_t;

/** Which kind of memory a communicator's buffers live in. */
typedef enum { loomDeviceHost = 0, loomDeviceCuda = 1 } loomDevice_t;

/** Color for ranks of loomCommSplit that join no new communicator. */
#define LOOM_SPLIT_NOCOLOR (-1)

/** Value of an int config field meaning "use the default from the environment or the library". */
#define LOOM_CONFIG_UNDEF_INT (-2147483647 - 1)

/**
 * Options for a new communicator. Always start from LOOM_CONFIG_INITIALIZER: it fills `size`, `magic` and
 * `version` so the library can read structs from older and newer headers safely, and leaves every option unset.
 */
typedef struct {
  size_t size;          /**< sizeof(loomConfig_t) as compiled by the caller. */
  unsigned int magic;   /**< LOOM_CONFIG_MAGIC. */
  unsigned int version; /**< LOOM_VERSION_CODE of the caller's header. */
  int blocking;         /**< 1 (default): init returns when ready; 0: init may return loomInProgress. */
  int timeoutMs;        /**< Deadline of every wait in ms; <= 0 unset means LOOM_TIMEOUT_MS. */
  const char* commName; /**< Name used in log lines and error messages (may be NULL). */
  int device;           /**< loomDeviceHost (default) or loomDeviceCuda. */
  int cudaDevice;       /**< CUDA device ordinal for a CUDA communicator; unset means the current one. */
  int nChannels;        /**< Channels (parallel rings / lanes) per collective; unset means tuned. */
  int deterministic;    /**< 1: reductions in rank order, the same bits whatever the algorithm (LOOM_DETERMINISTIC);
                             0: off; unset means LOOM_DETERMINISTIC. */
} loomConfig_t;

#define LOOM_CONFIG_MAGIC 0x6c6f6f6du /* "loom" */
#define LOOM_CONFIG_INITIALIZER                                                                                     \
  {                                                                                                                 \
    sizeof(loomConfig_t), LOOM_CONFIG_MAGIC, LOOM_VERSION_CODE, LOOM_CONFIG_UNDEF_INT, LOOM_CONFIG_UNDEF_INT, NULL, \
        LOOM_CONFIG_UNDEF_INT, LOOM_CONFIG_UNDEF_INT, LOOM_CONFIG_UNDEF_INT, LOOM_CONFIG_UNDEF_INT                  \
  }

/** A short, static description of a result code. */
const char* loomGetErrorString(loomResult_t result);
/** The message of the last error seen on `comm` (or on this thread when comm is NULL); "" when none. */
const char* loomGetLastError(loomComm_t comm);
/** Stores LOOM_VERSION_CODE of the library in *version. */
loomResult_t loomGetVersion(int* version);

/**
 * Makes a new unique id on the root rank: opens the root's rendezvous listener on this host and draws a
 * 128-bit secret. Call once, then give the id to every rank (over MPI, a file, an environment variable...).
 * The listener is a thread of the calling process: a program that forks its ranks should fork first.
 */
loomResult_t loomGetUniqueId(loomUniqueId* uniqueId);
/** Joins communicator `commId` as `rank` of `nranks`. Collective over all ranks: each calls it once. */
loomResult_t loomCommInitRank(loomComm_t* comm, int nranks, loomUniqueId commId, int rank);
/** As loomCommInitRank, with options; config may be NULL. */
loomResult_t loomCommInitRankConfig(loomComm_t* comm, int nranks, loomUniqueId commId, int rank, loomConfig_t* config);
/**
 * Joins the world communicator described by the environment of a launcher: loomrun (LOOM_RANK, LOOM_NRANKS,
 * LOOM_ROOT_ADDR), torchrun (RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT), Open MPI (OMPI_COMM_WORLD_RANK/SIZE),
 * MPICH/Hydra (PMI_RANK, PMI_SIZE) or Slurm (SLURM_PROCID, SLURM_NTASKS). Ranks other than 0 find the root at
 * LOOM_ROOT_ADDR, or MASTER_ADDR:MASTER_PORT; see docs/ENVIRONMENT.md.
 */
loomResult_t loomCommInitFromEnv(loomComm_t* comm);
/**
 * Splits `comm` into sub-communicators: ranks with equal `color` form one, ordered by `key` then by rank.
 * A rank passing LOOM_SPLIT_NOCOLOR gets *newcomm = NULL. Collective over `comm`.
 */
loomResult_t loomCommSplit(loomComm_t comm, int color, int key, loomComm_t* newcomm, loomConfig_t* config);
/** Flags of loomCommShrink (the values of NCCL's NCCL_SHRINK_*). */
#define LOOM_SHRINK_DEFAULT 0x00 /* the parent is healthy: none of its calls is in flight */
#define LOOM_SHRINK_ABORT 0x01   /* first end every call of the parent still in flight (after a failure) */
/**
 * Makes a communicator of the ranks of `comm` that are not in excludeRanksList, ordered as in `comm`. Collective
 * over those ranks only: the excluded ranks (dead ones, typically) do not call it, and every caller passes the
 * same list (in any order), else each gets loomInvalidUsage. With LOOM_SHRINK_ABORT the calls of `comm` still in
 * flight on other threads end first, with an error, and `comm` can then only be destroyed. config NULL: the
 * parent's settings.
 */
loomResult_t loomCommShrink(loomComm_t comm, const int* excludeRanksList, int excludeRanksCount, loomComm_t* newcomm,
                            loomConfig_t* config, int shrinkFlags);
/** Waits for every queued operation on comm to finish and stops accepting new ones. */
loomResult_t loomCommFinalize(loomComm_t comm);
/** Frees comm and every resource it holds. Not collective. */
loomResult_t loomCommDestroy(loomComm_t comm);
/** Makes every wait on comm return at once, from any thread, then frees comm. */
loomResult_t loomCommAbort(loomComm_t comm);
/**
 * Makes every wait on comm return at once, from any thread, and every later call fail, without freeing comm: a
 * thread may still be entering a call on it. Peers fail as after loomCommAbort. Destroy comm afterwards.
 */
loomResult_t loomCommRevoke(loomComm_t comm);
/** Stores in *asyncError the first error of an asynchronous operation on comm (loomSuccess when none). */
loomResult_t loomCommGetAsyncError(loomComm_t comm, loomResult_t* asyncError);
/** Number of ranks in comm. */
loomResult_t loomCommCount(const loomComm_t comm, int* count);
/** This rank's index in comm. */
loomResult_t loomCommUserRank(const loomComm_t comm, int* rank);

/** recvbuff[i] = op over all ranks of sendbuff[i], on every rank. In place when sendbuff == recvbuff. */
loomResult_t loomAllReduce(const void* sendbuff, void* recvbuff, size_t count, loomDataType_t datatype, loomRedOp_t op,
                           loomComm_t comm, loomStream_t stream);
/** recvbuff = root's sendbuff, on every rank. sendbuff is read on root only. */
loomResult_t loomBroadcast(const void* sendbuff, void* recvbuff, size_t count, loomDataType_t datatype, int root,
                           loomComm_t comm, loomStream_t stream);
/** On root: recvbuff[i] = op over all ranks of sendbuff[i]. recvbuff is written on root only. */
loomResult_t loomReduce(const void* sendbuff, void* recvbuff, size_t count, loomDataType_t datatype, loomRedOp_t op,
                        int root, loomComm_t comm, loomStream_t stream);
/** recvbuff[r*sendcount + i] = sendbuff of rank r [i]. In place when sendbuff == recvbuff + rank*sendcount. */
loomResult_t loomAllGather(const void* sendbuff, void* recvbuff, size_t sendcount, loomDataType_t datatype,
                           loomComm_t comm, loomStream_t stream);
/**
 * recvbuff[i] = op over ranks of sendbuff[rank*recvcount + i]. sendbuff holds nranks*recvcount elements.
 * In place when recvbuff == sendbuff + rank*recvcount.
 */
loomResult_t loomReduceScatter(const void* sendbuff, void* recvbuff, size_t recvcount, loomDataType_t datatype,
                               loomRedOp_t op, loomComm_t comm, loomStream_t stream);
/** recvbuff[p*count + i] = sendbuff of rank p [rank*count + i]. Buffers must not overlap. */
loomResult_t loomAllToAll(const void* sendbuff, void* recvbuff, size_t count, loomDataType_t datatype, loomComm_t comm,
                          loomStream_t stream);
/**
 * Rank r sends sendcounts[p] elements at sdispls[p] to each peer p, and receives recvcounts[p] elements at
 * rdispls[p] from each. Counts must agree pairwise. Displacements are in elements. Buffers must not overlap.
 */
loomResult_t loomAllToAllv(const void* sendbuff, const size_t sendcounts[], const size_t sdispls[], void* recvbuff,
                           const size_t recvcounts[], const size_t rdispls[], loomDataType_t datatype, loomComm_t comm,
                           loomStream_t stream);
/** On root: recvbuff[r*sendcount + i] = sendbuff of rank r [i]. In place when sendbuff == recvbuff + root*sendcount. */
loomResult_t loomGather(const void* sendbuff, void* recvbuff, size_t sendcount, loomDataType_t datatype, int root,
                        loomComm_t comm, loomStream_t stream);
/** recvbuff[i] = root's sendbuff[rank*recvcount + i]. In place on root when recvbuff == sendbuff + root*recvcount. */
loomResult_t loomScatter(const void* sendbuff, void* recvbuff, size_t recvcount, loomDataType_t datatype, int root,
                         loomComm_t comm, loomStream_t stream);
/** Sends count elements to peer. Pair with a loomRecv on peer; put pairs that must overlap in one group. */
loomResult_t loomSend(const void* sendbuff, size_t count, loomDataType_t datatype, int peer, loomComm_t comm,
                      loomStream_t stream);
/** Receives count elements from peer. */
loomResult_t loomRecv(void* recvbuff, size_t count, loomDataType_t datatype, int peer, loomComm_t comm,
                      loomStream_t stream);
/** Returns once every rank of comm has entered the barrier. */
loomResult_t loomBarrier(loomComm_t comm, loomStream_t stream);

/** Starts a group: calls until loomGroupEnd are queued, then run together. Groups nest. */
loomResult_t loomGroupStart(void);
/** Ends a group; the outermost end runs every queued call (blocking calls return when all are done). */
loomResult_t loomGroupEnd(void);

/** What loomGroupSimulateEnd reports. Start from LOOM_SIM_INFO_INITIALIZER, which sets `size`. */
typedef struct {
  size_t size;         /**< sizeof(loomSimInfo_t) as compiled by the caller. */
  float estimatedTime; /**< Predicted time of the group's calls, in microseconds. */
} loomSimInfo_t;
#define LOOM_SIM_INFO_INITIALIZER \
  { sizeof(loomSimInfo_t), 0.0f }
/**
 * Ends the outermost group without running it: its calls are dropped and simInfo->estimatedTime receives the
 * tuner's prediction of how long they would take (each communicator's calls one after another; communicators
 * at once). Send/Recv calls cannot be estimated (their peers' counts are unknown here): a group holding them is
 * refused and left open.
 */
loomResult_t loomGroupSimulateEnd(loomSimInfo_t* simInfo);

/** Creates a host stream: an in-order queue of calls run by a worker thread. */
loomResult_t loomStreamCreate(loomStream_t* stream);
/** Waits until every call queued on stream has finished; returns the first error among them. */
loomResult_t loomStreamSynchronize(loomStream_t stream);
/** Waits for stream, then frees it. */
loomResult_t loomStreamDestroy(loomStream_t stream);

/** Allocates size bytes of host memory that peers on this host can map for zero-copy transfers. */
loomResult_t loomMemAlloc(void** ptr, size_t size);
/** Frees memory from loomMemAlloc. */
loomResult_t loomMemFree(void* ptr);
/** Registers [buff, buff+size) with comm for zero-copy access by peers; *handle names the registration. */
loomResult_t loomCommRegister(const loomComm_t comm, void* buff, size_t size, void** handle);
/** Drops a registration made by loomCommRegister. */
loomResult_t loomCommDeregister(const loomComm_t comm, void* handle);

#if defined(__GNUC__)
#pragma GCC visibility pop
#endif

#ifdef __cplusplus
}
#endif

#endif /* LOOM_LOOM_H_ */
