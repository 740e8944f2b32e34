"""Hand-written honest candidate for the evaluator's throughput benchmark (not a model's output).

Task 40 (LayerNorm): y = nn.LayerNorm(normalized_shape)(x) with normalized_shape = (64, 256, 256)
and x of shape (16, 64, 256, 256): 16 rows of 4194304 floats each, normalised with the module's
own weight and bias (kept as self.ln, so the parameters are those of the reference).

Only 16 rows: each row must be spread over many CTAs. Sample 0 -- two kernels over chunks of
kChunk = 8192 floats, one CTA of 256 threads per (row, chunk) (8192 CTAs for the task):
* layer_norm_chunk_stats: the CTA holds its chunk in registers (8 x 128-bit vectors per thread, all
  loads in flight at once), reduces the chunk mean, then the sum of squared deviations from that
  mean from the same registers (exact two-pass inside the chunk, no E[x^2] - E[x]^2 cancellation),
  and writes (mean, M2) to a workspace.
* layer_norm_chunk_apply: the CTA issues its chunk's loads first, then its first warp merges the
  row's 512 (mean, M2) pairs with Chan's formula (lane l takes chunks l, l + 32, ..., then a fixed
  butterfly, so every CTA of the row computes the same bits), and the CTA writes
  (x - mean) * rstd * weight + bias with 128-bit accesses (biased variance, rstd = 1/sqrt(var +
  eps), as PyTorch).
Rows whose length is not a multiple of 4, or unaligned tensors, take a scalar instance of the same
two kernels. Cost: x read twice, y written once, weight and bias read once per row.

How it differs from the other samples: sample 1 accumulates (sum, sum of squares) in double and
uses three kernels (chunk sums, a per-row finalise, a flat apply); sample 2 runs a per-thread
Welford recurrence over a grid-stride loop with one CTA group per row, and applies in reverse
order so that the end of x still in L2 is re-read first.
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
namespace layer_norm_chunks_impl {

using namespace cute;

constexpr int kThreads = 256;
constexpr int kWarps   = kThreads / 32;
constexpr int kPer     = 32;                // floats per thread, held in registers
constexpr int kChunk   = kThreads * kPer;   // row elements per CTA
static_assert(kChunk == 8192, "the Python side sizes the workspace with CHUNK = 8192");
static_assert(kThreads % 32 == 0 && kWarps <= 32, "whole warps, and one warp can combine all warps");

// Sum over the CTA, returned to every thread; the trailing barrier lets `smem` be reused.
__device__ __forceinline__ float cta_sum(float v, float* smem) {
  CUTE_UNROLL
  for (int offset = 16; offset > 0; offset /= 2) v += __shfl_xor_sync(0xffffffffu, v, offset);
  int const warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  if (lane == 0) smem[warp] = v;
  __syncthreads();
  if (warp == 0) {
    v = lane < kWarps ? smem[lane] : 0.0f;
    CUTE_UNROLL
    for (int offset = 16; offset > 0; offset /= 2) v += __shfl_xor_sync(0xffffffffu, v, offset);
    if (lane == 0) smem[kWarps] = v;
  }
  __syncthreads();
  float const total = smem[kWarps];
  __syncthreads();
  return total;
}

// Merge partial (count, mean, M2) triples (Chan et al.); an empty side leaves the other as is.
__device__ __forceinline__ void merge(float& n, float& mean, float& m2, float nb, float mb, float m2b) {
  float const total = n + nb;
  if (total == 0.0f) return;
  float const delta = mb - mean;
  float const wb = nb / total;
  mean += delta * wb;
  m2 += m2b + delta * delta * n * wb;
  n = total;
}

// Thread-value layout of a chunk: thread t owns kIters vectors of kVec floats, kVec * kThreads
// apart; neighbouring threads own neighbouring vectors, so each warp access is one contiguous run.
template <int kVec>
__device__ __forceinline__ auto chunk_tv() {
  return make_layout(make_shape(Int<kVec>{}, Int<kThreads>{}, Int<kPer / kVec>{}));  // (VEC,THR,ITER)
}

// Kernel 1: (mean, M2) of chunk blockIdx.x % chunks of row blockIdx.x / chunks.
template <int kVec>
__global__ void __launch_bounds__(kThreads)
layer_norm_chunk_stats(float const* __restrict__ x, float* __restrict__ stats, int64_t cols, int64_t chunks) {
  constexpr int kIters = kPer / kVec;
  __shared__ float smem[kWarps + 1];
  int64_t const row = blockIdx.x / chunks, start = (blockIdx.x % chunks) * kChunk;
  int const count = int(min(int64_t(kChunk), cols - start));  // kVec divides count: whole vectors only

  // int64 offsets: rows * cols exceeds 2^31 elements.
  Tensor gX   = make_tensor(make_gmem_ptr(x + row * cols + start), make_shape(Int<kChunk>{}));  // (CHUNK)
  Tensor tXgX = composition(gX, chunk_tv<kVec>())(_, threadIdx.x, _);                         // (VEC,ITER)
  Tensor tXrX = make_tensor_like(tXgX);                                                       // (VEC,ITER) registers
  using VecCopy = Copy_Atom<UniversalCopy<conditional_t<kVec == 4, uint128_t, uint32_t>>, float>;

  CUTE_UNROLL
  for (int it = 0; it < kIters; ++it) {  // all loads in flight; vectors past the chunk are zeros
    if ((int(threadIdx.x) + it * kThreads) * kVec < count) copy(VecCopy{}, tXgX(_, it), tXrX(_, it));
    else fill(tXrX(_, it), 0.0f);
  }
  float s = 0.0f;
  CUTE_UNROLL
  for (int i = 0; i < size(tXrX); ++i) s += tXrX(i);
  float const mean = cta_sum(s, smem) / float(count);
  float sq = 0.0f;
  CUTE_UNROLL
  for (int it = 0; it < kIters; ++it) {
    if ((int(threadIdx.x) + it * kThreads) * kVec < count) {
      CUTE_UNROLL
      for (int v = 0; v < kVec; ++v) sq += (tXrX(v, it) - mean) * (tXrX(v, it) - mean);
    }
  }
  float const m2 = cta_sum(sq, smem);
  if (threadIdx.x == 0) {
    stats[2 * int64_t(blockIdx.x)]     = mean;
    stats[2 * int64_t(blockIdx.x) + 1] = m2;
  }
}

// Kernel 2: merge the row's chunk statistics, then normalise this chunk.
template <int kVec>
__global__ void __launch_bounds__(kThreads)
layer_norm_chunk_apply(float const* __restrict__ x, float const* __restrict__ w, float const* __restrict__ b,
                       float const* __restrict__ stats, float* __restrict__ y, int64_t cols, int64_t chunks,
                       float eps) {
  constexpr int kIters = kPer / kVec;
  __shared__ float row_stats[2];
  int64_t const row = blockIdx.x / chunks, start = (blockIdx.x % chunks) * kChunk;
  int const count = int(min(int64_t(kChunk), cols - start));

  Tensor gX   = make_tensor(make_gmem_ptr(x + row * cols + start), make_shape(Int<kChunk>{}));  // (CHUNK)
  Tensor gY   = make_tensor(make_gmem_ptr(y + row * cols + start), make_shape(Int<kChunk>{}));  // (CHUNK)
  Tensor gW   = make_tensor(make_gmem_ptr(w + start), make_shape(Int<kChunk>{}));               // (CHUNK)
  Tensor gB   = make_tensor(make_gmem_ptr(b + start), make_shape(Int<kChunk>{}));               // (CHUNK)
  Tensor tXgX = composition(gX, chunk_tv<kVec>())(_, threadIdx.x, _);                         // (VEC,ITER)
  Tensor tXgY = composition(gY, chunk_tv<kVec>())(_, threadIdx.x, _);                         // (VEC,ITER)
  Tensor tXgW = composition(gW, chunk_tv<kVec>())(_, threadIdx.x, _);                         // (VEC,ITER)
  Tensor tXgB = composition(gB, chunk_tv<kVec>())(_, threadIdx.x, _);                         // (VEC,ITER)
  Tensor tXrX = make_tensor_like(tXgX);                                                       // (VEC,ITER) registers
  using VecCopy = Copy_Atom<UniversalCopy<conditional_t<kVec == 4, uint128_t, uint32_t>>, float>;

  // The chunk's loads go out first: they overlap the merge of the statistics below.
  CUTE_UNROLL
  for (int it = 0; it < kIters; ++it) {
    if ((int(threadIdx.x) + it * kThreads) * kVec < count) copy(VecCopy{}, tXgX(_, it), tXrX(_, it));
  }

  if (threadIdx.x < 32) {
    Tensor gS = make_tensor(make_gmem_ptr(stats + 2 * row * chunks), make_layout(make_shape(Int<2>{}, chunks)));  // (2,CHUNKS)
    float n = 0.0f, mean = 0.0f, m2 = 0.0f;
    for (int64_t c = threadIdx.x; c < chunks; c += 32) {
      merge(n, mean, m2, float(min(int64_t(kChunk), cols - c * kChunk)), gS(0, c), gS(1, c));
    }
    CUTE_UNROLL
    for (int offset = 16; offset > 0; offset /= 2) {
      float const nb = __shfl_xor_sync(0xffffffffu, n, offset);
      float const mb = __shfl_xor_sync(0xffffffffu, mean, offset);
      float const m2b = __shfl_xor_sync(0xffffffffu, m2, offset);
      merge(n, mean, m2, nb, mb, m2b);
    }
    if (threadIdx.x == 0) {
      row_stats[0] = mean;
      row_stats[1] = rsqrtf(m2 / float(cols) + eps);  // biased variance, as PyTorch
    }
  }
  __syncthreads();
  float const mean = row_stats[0], rstd = row_stats[1];

  CUTE_UNROLL
  for (int it = 0; it < kIters; ++it) {
    if ((int(threadIdx.x) + it * kThreads) * kVec < count) {
      Tensor rW = make_tensor<float>(Shape<Int<kVec>>{});  // (VEC) registers
      Tensor rB = make_tensor<float>(Shape<Int<kVec>>{});  // (VEC) registers
      copy(VecCopy{}, tXgW(_, it), rW);
      copy(VecCopy{}, tXgB(_, it), rB);
      CUTE_UNROLL
      for (int v = 0; v < kVec; ++v) tXrX(v, it) = (tXrX(v, it) - mean) * rstd * rW(v) + rB(v);
      copy(VecCopy{}, tXrX(_, it), tXgY(_, it));
    }
  }
}

template <int kVec>
void launch(float const* x, float const* w, float const* b, float* stats, float* y, int64_t rows, int64_t cols,
            int64_t chunks, float eps, cudaStream_t stream) {
  unsigned const grid = unsigned(rows * chunks);
  layer_norm_chunk_stats<kVec><<<grid, kThreads, 0, stream>>>(x, stats, cols, chunks);
  layer_norm_chunk_apply<kVec><<<grid, kThreads, 0, stream>>>(x, w, b, stats, y, cols, chunks, eps);
}

}  // namespace layer_norm_chunks_impl

// x, y: (rows, cols) contiguous; w, b: (cols); stats: at least 2 * rows * ceil(cols / 8192) floats.
extern "C" int layer_norm(float const* x, float const* w, float const* b, float* stats, float* y, int64_t rows,
                          int64_t cols, float eps, cudaStream_t stream) {
  using namespace layer_norm_chunks_impl;
  if (rows == 0 || cols == 0) return cudaSuccess;  // nothing to normalise; an empty grid is a launch error
  int64_t const chunks = (cols + kChunk - 1) / kChunk;
  if (rows > INT32_MAX / chunks) return cudaErrorInvalidValue;  // grid.x = rows * chunks
  bool aligned = cols % 4 == 0;
  for (void const* p : {static_cast<void const*>(x), static_cast<void const*>(w), static_cast<void const*>(b),
                        static_cast<void const*>(y)}) {
    aligned = aligned && reinterpret_cast<uintptr_t>(p) % 16 == 0;
  }
  if (aligned) launch<4>(x, w, b, stats, y, rows, cols, chunks, eps, stream);
  else         launch<1>(x, w, b, stats, y, rows, cols, chunks, eps, stream);
  return cudaGetLastError();
}
"""

kernel = CuteKernel(
    CUDA_SRC, {"layer_norm": ("f32*", "f32*", "f32*", "f32*", "f32*", "i64", "i64", "f32")}, name="layer_norm_chunks"
)

CHUNK = 8192  # kChunk in the source: the workspace holds (mean, M2) per row chunk


class ModelNew(nn.Module):
    def __init__(self, normalized_shape: tuple):
        super().__init__()
        self.ln = nn.LayerNorm(normalized_shape=normalized_shape)  # same parameters as the reference

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        norm_dims = len(self.ln.normalized_shape)
        if x.dim() < norm_dims or tuple(x.shape[x.dim() - norm_dims:]) != tuple(self.ln.normalized_shape) \
                or self.ln.weight is None or self.ln.bias is None:
            raise NotImplementedError("x must end in normalized_shape, and the LayerNorm must be affine")
        x = x.contiguous()
        cols = self.ln.weight.numel()
        rows = x.numel() // cols if cols > 0 else 0
        chunks = (cols + CHUNK - 1) // CHUNK
        stats = torch.empty(max(1, 2 * rows * chunks), dtype=torch.float32, device=x.device)
        y = torch.empty_like(x)
        kernel.layer_norm(x, self.ln.weight.contiguous(), self.ln.bias.contiguous(), stats, y, rows, cols, float(self.ln.eps))
        return y
