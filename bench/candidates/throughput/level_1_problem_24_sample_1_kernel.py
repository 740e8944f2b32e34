"""Hand-written honest candidate for the evaluator's throughput benchmark (not a model's output).

Task 24 (LogSoftmax): y = log_softmax(x, dim) for x of shape (rows, cols), rows of 393216 floats;
dim is the constructor's (1 in the task) and must name the last dimension.

Sample 1 -- split rows, two kernels. Each row is cut into chunks of kChunk = 8192 floats and every
(row, chunk) pair gets its own CTA of 256 threads (a flat 1-D grid, chunks of a row adjacent):
* log_softmax_chunk_stats: the CTA loads its chunk into registers (32 scalars per thread, all loads in
  flight before any is used, neighbouring threads on neighbouring floats so every warp access is
  one 128-byte run), reduces the chunk maximum, then the sum of exp(x - chunk max) from the same
  registers (exact two-pass inside the chunk, no online rescaling), and writes (max, sum) to a
  workspace.
* log_softmax_chunk_apply: the first warp merges all (max, sum) pairs of the row in a fixed order (so
  every CTA of the row gets bit-identical statistics), then the CTA re-reads its chunk and writes
  (x - max) - log(sum).
Scalar accesses make any row length and alignment work without a peel. Cost: x read twice, y
written once, plus a workspace of 2 floats per chunk.

How it differs from the other samples: sample 0 gives each row one CTA and two sweeps with 128-bit
vectors; sample 2 keeps each row in the distributed shared memory of a CTA cluster and reads x once.
"""

import torch
import torch.nn as nn

from cutegen.runtime import CuteKernel

CUDA_SRC = r"""
#include <cstdint>
#include <cuda_runtime.h>
#include <cute/tensor.hpp>

// A named namespace: nvcc's host stubs cannot name kernels of an anonymous namespace while
// `using namespace cute` is in scope.
namespace log_softmax_split_impl {

using namespace cute;

constexpr int kThreads = 256;
constexpr int kWarps   = kThreads / 32;
constexpr int kPer     = 32;                 // floats per thread, held in registers
constexpr int kChunk   = kThreads * kPer;    // row elements per CTA
static_assert(kChunk == 8192, "the Python side sizes the workspace with CHUNK = 8192");
static_assert(kThreads % 32 == 0 && kWarps <= 32, "whole warps, and one warp can combine all warps");

struct MaxSum {
  float m;
  float s;
};

// Merge two partial results: the smaller maximum's sum is rescaled to the larger maximum.
__device__ __forceinline__ MaxSum combine(MaxSum a, MaxSum b) {
  float const m = fmaxf(a.m, b.m);
  if (m == -INFINITY) return {m, 0.0f};  // both empty: -inf - -inf would be NaN
  return {m, a.s * expf(a.m - m) + b.s * expf(b.m - m)};
}

struct MaxOp {
  __device__ float operator()(float a, float b) const { return fmaxf(a, b); }
};
struct SumOp {
  __device__ float operator()(float a, float b) const { return a + b; }
};

// op over the CTA, returned to every thread; `identity` fills the missing warps' slots. The trailing
// barrier lets the caller reuse `smem` for the next reduction.
template <class Op>
__device__ __forceinline__ float cta_reduce(float v, float identity, float* smem, Op op) {
  CUTE_UNROLL
  for (int offset = 16; offset > 0; offset /= 2) v = op(v, __shfl_xor_sync(0xffffffffu, v, offset));
  int const warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  if (lane == 0) smem[warp] = v;
  __syncthreads();
  if (warp == 0) {
    v = lane < kWarps ? smem[lane] : identity;
    CUTE_UNROLL
    for (int offset = 16; offset > 0; offset /= 2) v = op(v, __shfl_xor_sync(0xffffffffu, v, offset));
    if (lane == 0) smem[kWarps] = v;
  }
  __syncthreads();
  float const total = smem[kWarps];
  __syncthreads();
  return total;
}

// Thread t owns chunk elements t + k * kThreads, k < kPer: consecutive threads, consecutive floats.
__device__ __forceinline__ auto thread_layout() {
  return make_layout(make_shape(Int<kThreads>{}, Int<kPer>{}));  // (THR,PER):(_1,THR)
}

// Kernel 1: (max, sum of exp(x - max)) of chunk blockIdx.x % chunks of row blockIdx.x / chunks.
__global__ void __launch_bounds__(kThreads)
log_softmax_chunk_stats(float const* __restrict__ x, float* __restrict__ stats, int64_t cols, int64_t chunks) {
  __shared__ float smem[kWarps + 1];
  int64_t const row = blockIdx.x / chunks, chunk = blockIdx.x % chunks;
  int64_t const start = chunk * kChunk;
  int const count = int(min(int64_t(kChunk), cols - start));  // the last chunk of a row may be short

  // int64 offsets: rows * cols exceeds 2^31 elements.
  Tensor gX   = make_tensor(make_gmem_ptr(x + row * cols + start), make_shape(Int<kChunk>{}));  // (CHUNK)
  Tensor tXgX = composition(gX, thread_layout())(threadIdx.x, _);                             // (PER)
  Tensor tXrX = make_tensor_like(tXgX);                                                       // (PER) registers

  // Predicated loads, all issued before the first use; elements past the chunk hold -inf.
  CUTE_UNROLL
  for (int k = 0; k < kPer; ++k) {
    tXrX(k) = (int(threadIdx.x) + k * kThreads < count) ? tXgX(k) : -INFINITY;
  }
  float m = -INFINITY;
  CUTE_UNROLL
  for (int k = 0; k < kPer; ++k) m = fmaxf(m, tXrX(k));
  m = cta_reduce(m, -INFINITY, smem, MaxOp{});
  float s = 0.0f;
  if (m != -INFINITY) {  // all -inf: the chunk adds nothing (and -inf - -inf would be NaN)
    CUTE_UNROLL
    for (int k = 0; k < kPer; ++k) s += expf(tXrX(k) - m);  // padding: exp(-inf) = 0
  }
  s = cta_reduce(s, 0.0f, smem, SumOp{});
  if (threadIdx.x == 0) {
    stats[2 * int64_t(blockIdx.x)]     = m;
    stats[2 * int64_t(blockIdx.x) + 1] = s;
  }
}

// Kernel 2: merge the row's chunk statistics, then write y = (x - max) - log(sum) for this chunk.
__global__ void __launch_bounds__(kThreads)
log_softmax_chunk_apply(float const* __restrict__ x, float const* __restrict__ stats, float* __restrict__ y,
                    int64_t cols, int64_t chunks) {
  __shared__ float row_stats[2];
  int64_t const row = blockIdx.x / chunks, chunk = blockIdx.x % chunks;
  int64_t const start = chunk * kChunk;
  int const count = int(min(int64_t(kChunk), cols - start));

  Tensor gX   = make_tensor(make_gmem_ptr(x + row * cols + start), make_shape(Int<kChunk>{}));  // (CHUNK)
  Tensor gY   = make_tensor(make_gmem_ptr(y + row * cols + start), make_shape(Int<kChunk>{}));  // (CHUNK)
  Tensor tXgX = composition(gX, thread_layout())(threadIdx.x, _);                             // (PER)
  Tensor tXgY = composition(gY, thread_layout())(threadIdx.x, _);                             // (PER)
  Tensor tXrX = make_tensor_like(tXgX);                                                       // (PER) registers

  // Issue the chunk's loads first: they overlap the merge of the statistics below.
  CUTE_UNROLL
  for (int k = 0; k < kPer; ++k) {
    if (int(threadIdx.x) + k * kThreads < count) tXrX(k) = tXgX(k);
  }

  if (threadIdx.x < 32) {
    // Lane l merges chunks l, l + 32, ...; then a fixed butterfly: every CTA of the row computes
    // the same bits, so no chunk is normalised with a slightly different sum than its neighbours.
    Tensor gS = make_tensor(make_gmem_ptr(stats + 2 * row * chunks), make_layout(make_shape(Int<2>{}, chunks)));  // (2,CHUNKS)
    MaxSum acc{-INFINITY, 0.0f};
    for (int64_t c = threadIdx.x; c < chunks; c += 32) acc = combine(acc, MaxSum{gS(0, c), gS(1, c)});
    CUTE_UNROLL
    for (int offset = 16; offset > 0; offset /= 2) {
      MaxSum other{__shfl_xor_sync(0xffffffffu, acc.m, offset), __shfl_xor_sync(0xffffffffu, acc.s, offset)};
      acc = combine(acc, other);
    }
    if (threadIdx.x == 0) {
      row_stats[0] = acc.m;
      row_stats[1] = logf(acc.s);  // a row of all -inf: -inf - -inf = NaN below, as in torch
    }
  }
  __syncthreads();
  float const row_max = row_stats[0], log_sum = row_stats[1];
  CUTE_UNROLL
  for (int k = 0; k < kPer; ++k) {
    if (int(threadIdx.x) + k * kThreads < count) tXgY(k) = (tXrX(k) - row_max) - log_sum;  // PyTorch's order
  }
}

}  // namespace log_softmax_split_impl

// x, y: (rows, cols) contiguous; stats: at least 2 * rows * ceil(cols / 8192) floats.
extern "C" int log_softmax_rows(float const* x, float* stats, float* y, int64_t rows, int64_t cols, cudaStream_t stream) {
  using namespace log_softmax_split_impl;
  if (rows == 0 || cols == 0) return cudaSuccess;  // nothing to do; an empty grid is a launch error
  int64_t const chunks = (cols + kChunk - 1) / kChunk;
  if (rows > INT32_MAX / chunks) return cudaErrorInvalidValue;  // grid.x = rows * chunks
  unsigned const grid = unsigned(rows * chunks);
  log_softmax_chunk_stats<<<grid, kThreads, 0, stream>>>(x, stats, cols, chunks);
  log_softmax_chunk_apply<<<grid, kThreads, 0, stream>>>(x, stats, y, cols, chunks);
  return cudaGetLastError();
}
"""

kernel = CuteKernel(CUDA_SRC, {"log_softmax_rows": ("f32*", "f32*", "f32*", "i64", "i64")}, name="log_softmax_split")

CHUNK = 8192  # kChunk in the source: the workspace holds (max, sum) per row chunk


class ModelNew(nn.Module):
    def __init__(self, dim: int = 1):
        super().__init__()
        self.dim = dim

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.dim() == 0 or self.dim % x.dim() != x.dim() - 1:
            raise NotImplementedError("this kernel reduces over the last dimension only (dim=1 of the task's 2-D input)")
        x = x.contiguous()
        cols = x.shape[-1]
        rows = 1
        for size in x.shape[:-1]:
            rows *= size
        chunks = (cols + CHUNK - 1) // CHUNK
        stats = torch.empty(max(1, 2 * rows * chunks), dtype=torch.float32, device=x.device)
        y = torch.empty_like(x)
        kernel.log_softmax_rows(x, stats, y, rows, cols)
        return y
