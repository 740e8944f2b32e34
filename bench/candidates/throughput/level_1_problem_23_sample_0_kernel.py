"""Hand-written honest candidate for the evaluator's throughput benchmark (not a model's output).

Task 23 (Softmax): y = softmax(x, dim=1) for x of shape (rows, cols), rows of 393216 floats.

Sample 0 -- one CTA per row, two sweeps over global memory. A first sweep finds the row maximum m
and the sum s of exp(x - m) in one read with the online recurrence (when m grows, s is rescaled by
exp(m_old - m_new)); a second sweep re-reads the row and writes exp(x - m) / s. Each row is split
into a scalar head up to the first 16-byte boundary, a body of 128-bit vectors (kIters of them in
flight per thread) and a scalar tail, so rows of any length and any 4-byte alignment vectorise.
Cost: x is read twice (the second read hits L2 only for the part of the row still resident), y is
written once.

How it differs from the other samples: sample 1 splits each row over many CTAs (per-chunk
statistics written to a workspace, then a second kernel that merges them and writes its chunk);
sample 2 keeps the row in the distributed shared memory of a thread-block cluster (up to 16 CTAs),
so x is read from DRAM only once.
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
namespace softmax_rowcta_impl {

using namespace cute;

constexpr int kThreads = 512;                // one CTA per row
constexpr int kWarps   = kThreads / 32;
constexpr int kVec     = 4;                  // floats per 128-bit access
constexpr int kIters   = 4;                  // vectors in flight per thread per step
constexpr int kStep    = kThreads * kIters;  // vectors a CTA covers per step

static_assert(sizeof(float) * kVec == 16, "a vector must be exactly one 128-bit access");
static_assert(kThreads % 32 == 0 && kWarps <= 32, "whole warps, and one warp can combine all warps");

// Running maximum m and sum s of exp(x - m) over the elements seen so far; {-inf, 0} is "none".
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

// Fold a vector of values into a running result: one rescale per vector, not per element.
template <class Values>
__device__ __forceinline__ MaxSum fold(MaxSum acc, Values const& v) {
  float vmax = v(0);
  CUTE_UNROLL
  for (int i = 1; i < size(v); ++i) vmax = fmaxf(vmax, v(i));
  float const m = fmaxf(acc.m, vmax);
  if (m == -INFINITY) return acc;  // every value so far is -inf: nothing to add
  float s = acc.s * expf(acc.m - m);
  CUTE_UNROLL
  for (int i = 0; i < size(v); ++i) s += expf(v(i) - m);
  return {m, s};
}

// The (m, s) of the whole CTA, returned to every thread: warp shuffles, then one value per warp
// through shared memory, combined by warp 0.
__device__ __forceinline__ MaxSum cta_reduce(MaxSum acc, MaxSum* smem) {
  CUTE_UNROLL
  for (int offset = 16; offset > 0; offset /= 2) {
    MaxSum other{__shfl_xor_sync(0xffffffffu, acc.m, offset), __shfl_xor_sync(0xffffffffu, acc.s, offset)};
    acc = combine(acc, other);
  }
  int const warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  if (lane == 0) smem[warp] = acc;
  __syncthreads();
  if (warp == 0) {
    acc = lane < kWarps ? smem[lane] : MaxSum{-INFINITY, 0.0f};
    CUTE_UNROLL
    for (int offset = 16; offset > 0; offset /= 2) {
      MaxSum other{__shfl_xor_sync(0xffffffffu, acc.m, offset), __shfl_xor_sync(0xffffffffu, acc.s, offset)};
      acc = combine(acc, other);
    }
    if (lane == 0) smem[kWarps] = acc;
  }
  __syncthreads();
  return smem[kWarps];
}

// A row seen as [0, head) scalars, then nvec 128-bit vectors, then scalars from tail to the end.
// Vectors need x and y 16-byte aligned at the same column, i.e. both rows at the same offset within
// a 16-byte line (true for tensors fresh from the allocator, whatever cols is); otherwise the whole
// row is "head" and goes scalar.
struct RowSplit {
  int64_t head;
  int64_t nvec;
  int64_t tail;
};

__device__ __forceinline__ RowSplit split_row(float const* px, float const* py, int64_t cols) {
  if (((reinterpret_cast<uintptr_t>(px) ^ reinterpret_cast<uintptr_t>(py)) & 15) != 0) return {cols, 0, cols};
  int64_t const head = min(cols, int64_t(((16 - (reinterpret_cast<uintptr_t>(px) & 15)) & 15) / sizeof(float)));
  int64_t const nvec = (cols - head) / kVec;
  return {head, nvec, head + nvec * kVec};
}

__global__ void __launch_bounds__(kThreads)
softmax_row_kernel(float const* __restrict__ x, float* __restrict__ y, int64_t cols) {
  __shared__ MaxSum smem[kWarps + 1];
  // int64 offsets: rows * cols exceeds 2^31 elements.
  float const* px = x + int64_t(blockIdx.x) * cols;
  float* py = y + int64_t(blockIdx.x) * cols;
  RowSplit const rs = split_row(px, py, cols);

  Tensor gX  = make_tensor(make_gmem_ptr(px), make_shape(cols));                                              // (COLS)
  Tensor gY  = make_tensor(make_gmem_ptr(py), make_shape(cols));                                              // (COLS)
  Tensor gXv = make_tensor(make_gmem_ptr(px + rs.head), make_layout(make_shape(Int<kVec>{}, rs.nvec)));       // (VEC,NVEC)
  Tensor gYv = make_tensor(make_gmem_ptr(py + rs.head), make_layout(make_shape(Int<kVec>{}, rs.nvec)));       // (VEC,NVEC)
  using VecCopy = Copy_Atom<UniversalCopy<uint128_t>, float>;

  // Sweep 1: online max and sum. Scalars of head and tail first (at most 3 + 3 elements).
  MaxSum acc{-INFINITY, 0.0f};
  for (int64_t i = threadIdx.x; i < rs.head; i += kThreads) acc = combine(acc, MaxSum{gX(i), 1.0f});
  for (int64_t i = rs.tail + threadIdx.x; i < cols; i += kThreads) acc = combine(acc, MaxSum{gX(i), 1.0f});
  // Body: vector v = step + it * kThreads + thread, so each warp access is one contiguous 512-byte
  // run; all kIters loads issue before the folds wait on them.
  for (int64_t step = 0; step < rs.nvec; step += kStep) {
    Tensor rX = make_tensor<float>(Shape<Int<kVec>, Int<kIters>>{});                                       // (VEC,ITER)
    bool pred[kIters];
    CUTE_UNROLL
    for (int it = 0; it < kIters; ++it) {
      int64_t const v = step + it * kThreads + threadIdx.x;
      pred[it] = v < rs.nvec;
      if (pred[it]) copy(VecCopy{}, gXv(_, v), rX(_, it));
    }
    CUTE_UNROLL
    for (int it = 0; it < kIters; ++it) {
      if (pred[it]) acc = fold(acc, rX(_, it));
    }
  }
  acc = cta_reduce(acc, smem);
  float const row_max = acc.m;
  // A row of all -inf has s = 0: 1/0 = inf and exp(-inf - -inf) = NaN, so the row is NaN, as in torch.
  float const inv_sum = 1.0f / acc.s;

  // Sweep 2: y = exp(x - max) / sum; the row was read moments ago, so part of it still hits in L2.
  for (int64_t i = threadIdx.x; i < rs.head; i += kThreads) gY(i) = expf(gX(i) - row_max) * inv_sum;
  for (int64_t i = rs.tail + threadIdx.x; i < cols; i += kThreads) gY(i) = expf(gX(i) - row_max) * inv_sum;
  for (int64_t step = 0; step < rs.nvec; step += kStep) {
    Tensor rX = make_tensor<float>(Shape<Int<kVec>, Int<kIters>>{});                                       // (VEC,ITER)
    bool pred[kIters];
    CUTE_UNROLL
    for (int it = 0; it < kIters; ++it) {
      int64_t const v = step + it * kThreads + threadIdx.x;
      pred[it] = v < rs.nvec;
      if (pred[it]) copy(VecCopy{}, gXv(_, v), rX(_, it));
    }
    CUTE_UNROLL
    for (int it = 0; it < kIters; ++it) {
      if (pred[it]) {
        CUTE_UNROLL
        for (int e = 0; e < kVec; ++e) rX(e, it) = expf(rX(e, it) - row_max) * inv_sum;
        copy(VecCopy{}, rX(_, it), gYv(_, step + it * kThreads + threadIdx.x));
      }
    }
  }
}

}  // namespace softmax_rowcta_impl

// x, y: (rows, cols) contiguous; softmax over each row.
extern "C" int softmax_rows(float const* x, float* y, int64_t rows, int64_t cols, cudaStream_t stream) {
  using namespace softmax_rowcta_impl;
  if (rows == 0 || cols == 0) return cudaSuccess;  // nothing to do; an empty grid is a launch error
  if (rows > INT32_MAX) return cudaErrorInvalidValue;  // grid.x limit: one CTA per row
  softmax_row_kernel<<<dim3{unsigned(rows)}, kThreads, 0, stream>>>(x, y, cols);
  return cudaGetLastError();
}
"""

kernel = CuteKernel(CUDA_SRC, {"softmax_rows": ("f32*", "f32*", "i64", "i64")}, name="softmax_rowcta")


class ModelNew(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.dim() != 2:
            raise NotImplementedError("this kernel takes softmax over dim 1 of a 2-D tensor (the task's shape)")
        x = x.contiguous()
        y = torch.empty_like(x)
        kernel.softmax_rows(x, y, x.shape[0], x.shape[1])
        return y
