/*
 * loom_ep.h — expert parallelism's all-to-all: dispatch every token to the ranks of its top-k experts, and
 * combine the experts' outputs back into token order, weighted.
 *
 * An EP object is made once per communicator and shape (collectively, on every rank) and then serves any number
 * of dispatch/combine pairs. Every rank holds numExperts / nranks experts: rank r holds experts
 * r * L .. r * L + L - 1 (L = numExperts / nranks, its "local" experts).
 *
 * Dispatch: token t of this rank (row t of x, [numTokens, hidden]) goes to expert topkIdx[t * topk + j] for each
 * j (-1: no expert) with weight topkWeights[t * topk + j]. Each token crosses to a rank once however many of that
 * rank's experts it chose. On the receiving rank, the rows of local expert e are recvX[e, 0 .. count[e] - 1]
 * (recvX is [L, expertCapacity, hidden]), ordered by source rank, then by token index: the same layout in both
 * modes, so an expert may run over its rows as one batch.
 *
 * Combine: each expert's output rows, expertOut with recvX's layout, go back to the token's rank, where
 * out[t] = sum over j of topkWeights[t * topk + j] * expertOut(row of token t at expert topkIdx[t * topk + j]),
 * summed in fp32 (tokens with no expert get zeros). With identity experts, out[t] = x[t] * sum of its weights.
 *
 * Modes:
 *  - loomEpNormal (throughput): the counts first, then the rows as one grouped all-to-all (loomAllToAllv's
 *    algorithms and transports). Across hosts it is hierarchical: a token crosses to each host it needs once, to
 *    the rank there with the sender's place on its own host, which forwards it to the ranks of its experts.
 *  - loomEpLowLatency: receive buffers of fixed capacity are made on every rank at create time; each sender puts
 *    its tokens straight into its slots there, flagged: the counts as LL words (each 8-byte word: 4 bytes of data
 *    and the call's flag), each row followed by a flag stored after it. There is no count exchange and no
 *    barrier: receivers poll the flags. Buffers alternate between calls, so back-to-back calls need no
 *    synchronisation. Peers on the same machine write into the mapped buffer; others' puts travel through the
 *    communicator's connections (the network proxy).
 *
 * Host communicators only in this version: buffers are host memory; a non-NULL stream (from loomStreamCreate) is
 * synchronised first and the call then runs on the calling thread. Errors follow loom.h: bad shapes, indices or
 * buffers give loomInvalidArgument with a message (loomGetLastError) and change nothing.
 */
#ifndef LOOM_LOOM_EP_H_
#define LOOM_LOOM_EP_H_

#include "loom/loom.h"

#ifdef __cplusplus
extern "C" {
#endif

#if defined(__GNUC__)
#pragma GCC visibility push(default)
#endif

typedef enum { loomEpNormal = 0, loomEpLowLatency = 1 } loomEpMode_t;

/** Shape and options of an EP object: the same on every rank. Start from LOOM_EP_CONFIG_INITIALIZER. */
typedef struct {
  size_t size;             /**< sizeof(loomEpConfig_t) as compiled by the caller. */
  int maxTokensPerRank;    /**< Most tokens one rank dispatches in one call. */
  int hidden;              /**< Elements per token row. */
  int numExperts;          /**< Experts in all; a multiple of the rank count. */
  int topk;                /**< Experts per token (entries of topkIdx per token), 1..64. */
  loomDataType_t datatype; /**< Element type of x, recvX, expertOut and out. */
  loomEpMode_t mode;       /**< loomEpNormal or loomEpLowLatency. */
  int expertCapacity;      /**< Rows per local expert in recvX; 0: nranks * maxTokensPerRank (never overflows). */
  int dropOverflow;        /**< 0: rows past expertCapacity fail the dispatch; 1: they are dropped and counted. */
} loomEpConfig_t;

#define LOOM_EP_CONFIG_INITIALIZER \
  { sizeof(loomEpConfig_t), 0, 0, 0, 1, loomBfloat16, loomEpNormal, 0, 0 }

typedef struct loomEp* loomEp_t;
/** What one dispatch routed, for its combine: made by loomEpDispatch, freed by loomEpHandleFree. */
typedef struct loomEpHandle* loomEpHandle_t;

/** What an EP object has done so far on this rank. */
typedef struct {
  uint64_t dispatches, combines;
  uint64_t droppedRows;     /**< Rows dropped past expertCapacity (dropOverflow = 1), all dispatches. */
  uint64_t lastDroppedRows; /**< ... in the last dispatch. */
  uint64_t bytesSent;       /**< Token and row bytes this rank sent to other ranks (payload, not protocol). */
  size_t bufferBytes;       /**< Receive buffers this object holds (low-latency mode; 0 in normal mode). */
} loomEpStats_t;

/**
 * Makes an EP object for comm with config. Collective: every rank calls it with the same config. It runs on the
 * calling thread and holds the communicator while it connects: synchronise host streams with calls on comm first.
 */
loomResult_t loomEpCreate(loomComm_t comm, const loomEpConfig_t* config, loomEp_t* ep);

/**
 * Sends each of this rank's numTokens tokens (x: [numTokens, hidden]) to the ranks of its experts (topkIdx,
 * topkWeights: [numTokens, topk], int32 and float). Fills recvX ([L, expertCapacity, hidden]) and
 * recvTokenCountsPerLocalExpert ([L]), and returns the routing for the combine in *handleOut. Collective.
 */
loomResult_t loomEpDispatch(loomEp_t ep, const void* x, int numTokens, const int32_t* topkIdx, const float* topkWeights,
                            void* recvX, int* recvTokenCountsPerLocalExpert, loomEpHandle_t* handleOut,
                            loomStream_t stream);

/**
 * Returns the experts' outputs (expertOut: recvX's layout) to their tokens' ranks and writes the weighted sum of
 * each token's rows into out ([numTokens, hidden] of the dispatch that made handle). Collective; the handle stays
 * valid (a backward pass may combine again).
 */
loomResult_t loomEpCombine(loomEp_t ep, const void* expertOut, loomEpHandle_t handle, void* out, loomStream_t stream);

/** Frees a handle from loomEpDispatch (NULL: nothing). */
loomResult_t loomEpHandleFree(loomEpHandle_t handle);
/** This rank's counters (see loomEpStats_t). */
loomResult_t loomEpGetStats(loomEp_t ep, loomEpStats_t* stats);
/**
 * Frees an EP object. Not collective; no call may be running on it. An object may outlive its communicator: when
 * the communicator is destroyed or aborted the object lets go of it, and then only loomEpGetStats and
 * loomEpDestroy work on it (other calls: loomInvalidUsage).
 */
loomResult_t loomEpDestroy(loomEp_t ep);

#if defined(__GNUC__)
#pragma GCC visibility pop
#endif

#ifdef __cplusplus
}
#endif

#endif /* LOOM_LOOM_EP_H_ */
