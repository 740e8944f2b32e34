"""Hand-written honest candidate for the evaluator's throughput benchmark (not a model's output).

Task 39 (L2Norm): y = x / norm(x, p=2, dim=1, keepdim=True) for x of shape (rows, cols) = (32768, 65535).

Sample 0 -- one fused kernel, one CTA of 512 threads per row, two sweeps over global memory: the
first reduces the row's sum of x^2 (fp32 per thread, then warp shuffles and one value per warp
through shared memory), the second re-reads the row and writes x / d with d = norm = sqrt(sum)
(a true division, as PyTorch does). Rows of 65535 floats start at every offset within a 16-byte
line, so each row is split into a scalar head up to its first 16-byte boundary, a body of 128-bit
vectors (kIters in flight per thread) and a scalar tail: the body vectorises whatever the row's
alignment. Cost: x read twice (the second read hits L2 only for what is still resident), y
written once.

How it differs from the other samples: sample 1 holds each row in the distributed shared memory
of a 4-CTA cluster and reads x once; sample 2 is two kernels, a row reduction into a workspace of
per-row divisors and a flat, row-agnostic elementwise division.
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
namespace l2_norm_rowcta_impl {

using namespace cute;

constexpr int kThreads = 512;                // one CTA per row
constexpr int kWarps   = kThreads / 32;
constexpr int kVec     = 4;                  // floats per 128-bit access
constexpr int kIters   = 4;                  // vectors in flight per thread per step
constexpr int kStep    = kThreads * kIters;  // vectors a CTA covers per step

static_assert(sizeof(float) * kVec == 16, "a vector must be exactly one 128-bit access");
static_assert(kThreads % 32 == 0 && kWarps <= 32, "whole warps, and one warp can combine all warps");

// The per-element term of the reduction: sum of x^2.
__device__ __forceinline__ float term(float v) { return v * v; }

// Sum over the CTA, returned to every thread. `smem` holds kWarps + 1 floats.
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
norm_row_kernel(float const* __restrict__ x, float* __restrict__ y, int64_t cols) {
  __shared__ float smem[kWarps + 1];
  // int64 offsets: rows * cols exceeds 2^31 elements.
  float const* px = x + int64_t(blockIdx.x) * cols;
  float* py = y + int64_t(blockIdx.x) * cols;
  RowSplit const rs = split_row(px, py, cols);

  Tensor gX  = make_tensor(make_gmem_ptr(px), make_shape(cols));                                              // (COLS)
  Tensor gY  = make_tensor(make_gmem_ptr(py), make_shape(cols));                                              // (COLS)
  Tensor gXv = make_tensor(make_gmem_ptr(px + rs.head), make_layout(make_shape(Int<kVec>{}, rs.nvec)));       // (VEC,NVEC)
  Tensor gYv = make_tensor(make_gmem_ptr(py + rs.head), make_layout(make_shape(Int<kVec>{}, rs.nvec)));       // (VEC,NVEC)
  using VecCopy = Copy_Atom<UniversalCopy<uint128_t>, float>;

  // Sweep 1: the row's sum of x^2. Head and tail scalars first (at most 3 + 3 elements).
  float acc = 0.0f;
  for (int64_t i = threadIdx.x; i < rs.head; i += kThreads) acc += term(gX(i));
  for (int64_t i = rs.tail + threadIdx.x; i < cols; i += kThreads) acc += term(gX(i));
  // Body: vector v = step + it * kThreads + thread, so each warp access is one contiguous 512-byte
  // run; all kIters loads issue before the adds wait on them.
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
        for (int e = 0; e < kVec; ++e) acc += term(rX(e, it));
      }
    }
  }
  float const sum = cta_sum(acc, smem);
  float const denom = sqrtf(sum);  // a zero row gives 0/0 = NaN, as in torch

  // Sweep 2: y = x / d; the row was read moments ago, so part of it still hits in L2.
  for (int64_t i = threadIdx.x; i < rs.head; i += kThreads) gY(i) = gX(i) / denom;
  for (int64_t i = rs.tail + threadIdx.x; i < cols; i += kThreads) gY(i) = gX(i) / denom;
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
        for (int e = 0; e < kVec; ++e) rX(e, it) = rX(e, it) / denom;
        copy(VecCopy{}, rX(_, it), gYv(_, step + it * kThreads + threadIdx.x));
      }
    }
  }
}

}  // namespace l2_norm_rowcta_impl

// x, y: (rows, cols) contiguous; y = x / norm(x) over each row.
extern "C" int l2_norm_rows(float const* x, float* y, int64_t rows, int64_t cols, cudaStream_t stream) {
  using namespace l2_norm_rowcta_impl;
  if (rows == 0 || cols == 0) return cudaSuccess;  // nothing to do; an empty grid is a launch error
  if (rows > INT32_MAX) return cudaErrorInvalidValue;  // grid.x limit: one CTA per row
  norm_row_kernel<<<dim3{unsigned(rows)}, kThreads, 0, stream>>>(x, y, cols);
  return cudaGetLastError();
}
"""

kernel = CuteKernel(CUDA_SRC, {"l2_norm_rows": ("f32*", "f32*", "i64", "i64")}, name="l2_norm_rowcta")


class ModelNew(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.dim() != 2:
            raise NotImplementedError("this kernel normalises over dim 1 of a 2-D tensor (the task's shape)")
        x = x.contiguous()
        y = torch.empty_like(x)
        kernel.l2_norm_rows(x, y, x.shape[0], x.shape[1])
        return y
