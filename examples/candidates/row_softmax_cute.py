"""Example candidate for examples/tasks/row_softmax.py: y = softmax(x, dim=-1) over the rows of x.

One CuTe kernel, one CTA per row, memory-bound. The row is reduced in a single sweep with the online
softmax recurrence: each thread keeps a running maximum m and a running sum s of exp(x - m), and when
m grows the sum is rescaled by exp(m_old - m_new), so max and sum come out of one read of the row
instead of two. The per-thread (m, s) pairs are then combined across the CTA (warp shuffles, then
one value per warp through shared memory). A second sweep writes exp(x - m) / s; it re-reads the row
that this CTA has just read, so those bytes come from L1/L2 and DRAM sees each element read once and
written once. Any row length works: no part of the row has to fit in registers.

Accesses are 128-bit vectors (4 floats) and each thread has several of them in flight per step, as in
swish_scale_cute.py; the residue step of a row (cols not a multiple of the step) and unaligned rows
(cols not a multiple of 4, or a pointer off a 16-byte boundary) take a predicated scalar path.
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
namespace row_softmax_impl {

using namespace cute;

constexpr int kThreads = 256;                      // threads per CTA; one CTA per row
constexpr int kWarps   = kThreads / 32;
constexpr int kVec     = 4;                        // floats per 128-bit access
constexpr int kIters   = 4;                        // vectors per thread per step: loads in flight
constexpr int kStep    = kVec * kThreads * kIters; // row elements a CTA covers per step

static_assert(sizeof(float) * kVec == 16, "a vector must be exactly one 128-bit access");
static_assert(kThreads % 32 == 0 && kWarps <= 32, "whole warps, and one warp can combine all warps");

// Running maximum m and sum s of exp(x - m) over the elements seen so far; {-inf, 0} is "none".
struct MaxSum {
  float m;
  float s;
};

// Merge two partial results: the smaller maximum's sum is rescaled to the larger maximum.
__device__ __forceinline__ MaxSum combine(MaxSum a, MaxSum b) {
  float m = fmaxf(a.m, b.m);
  if (m == -INFINITY) return {m, 0.0f};  // both empty: -inf - -inf would be NaN
  return {m, a.s * expf(a.m - m) + b.s * expf(b.m - m)};
}

// Fold a vector of values into a running result: one rescale per vector, not per element.
template <class Values>
__device__ __forceinline__ MaxSum fold(MaxSum acc, Values const& v) {
  float vmax = v(0);
  CUTE_UNROLL
  for (int i = 1; i < size(v); ++i) vmax = fmaxf(vmax, v(i));
  float m = fmaxf(acc.m, vmax);
  if (m == -INFINITY) return acc;  // every value so far is -inf: nothing to add
  float s = acc.s * expf(acc.m - m);
  CUTE_UNROLL
  for (int i = 0; i < size(v); ++i) s += expf(v(i) - m);
  return {m, s};
}

// The (m, s) of the whole CTA, returned to every thread.
__device__ __forceinline__ MaxSum cta_reduce(MaxSum acc, MaxSum* smem) {
  CUTE_UNROLL
  for (int offset = 16; offset > 0; offset /= 2) {
    MaxSum other{__shfl_xor_sync(0xffffffffu, acc.m, offset), __shfl_xor_sync(0xffffffffu, acc.s, offset)};
    acc = combine(acc, other);
  }
  int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
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

// kAligned: every row starts on a 16-byte boundary (pointers aligned, cols % 4 == 0), so full steps
// may use 128-bit accesses.
template <bool kAligned>
__global__ void __launch_bounds__(kThreads)
row_softmax_kernel(float const* __restrict__ x, float* __restrict__ y, int cols) {
  __shared__ MaxSum smem[kWarps + 1];

  // int64 row stride: rows * cols may exceed 2^31 elements.
  auto row_major = make_layout(make_shape(int(gridDim.x), cols), make_stride(int64_t(cols), Int<1>{}));
  Tensor mX = make_tensor(make_gmem_ptr(x), row_major);                          // (ROWS,COLS)
  Tensor mY = make_tensor(make_gmem_ptr(y), row_major);                          // (ROWS,COLS)
  Tensor gX = local_tile(mX(blockIdx.x, _), Shape<Int<kStep>>{}, make_coord(_)); // (STEP,NSTEP)
  Tensor gY = local_tile(mY(blockIdx.x, _), Shape<Int<kStep>>{}, make_coord(_)); // (STEP,NSTEP)
  // Logical column of every element, partitioned like the data: the residue step's predicate.
  Tensor cX = local_tile(make_identity_tensor(make_shape(cols)), Shape<Int<kStep>>{}, make_coord(_)); // (STEP,NSTEP)

  // Thread-value layout of a step: thread t owns kIters vectors of kVec contiguous floats, and
  // neighbouring threads own neighbouring vectors, so each warp access is one contiguous run.
  auto tv = make_layout(make_shape(Int<kVec>{}, Int<kThreads>{}, Int<kIters>{})); // (VEC,THR,ITER):(_1,VEC,VEC*THR)
  using VecCopy = Copy_Atom<UniversalCopy<uint128_t>, float>;
  int const steps = size<1>(gX);

  // Sweep 1: online max and sum over the row.
  MaxSum acc{-INFINITY, 0.0f};
  for (int step = 0; step < steps; ++step) {
    Tensor tXgX = composition(gX(_, step), tv)(_, threadIdx.x, _);             // (VEC,ITER)
    if (kAligned && (step + 1) * kStep <= cols) {
      Tensor tXrX = make_tensor_like(tXgX);                                     // (VEC,ITER) registers
      copy(VecCopy{}, tXgX, tXrX);  // all kIters loads issue before the math below waits on them
      CUTE_UNROLL
      for (int it = 0; it < kIters; ++it) acc = fold(acc, tXrX(_, it));
    } else {
      Tensor tXcX = composition(cX(_, step), tv)(_, threadIdx.x, _);           // (VEC,ITER)
      CUTE_UNROLL
      for (int i = 0; i < size(tXgX); ++i) {
        if (elem_less(tXcX(i), make_shape(cols))) {
          acc = combine(acc, MaxSum{tXgX(i), 1.0f});  // one element v is (m, s) = (v, exp(0))
        }
      }
    }
  }
  acc = cta_reduce(acc, smem);
  float const row_max = acc.m;
  float const inv_sum = 1.0f / acc.s;

  // Sweep 2: y = exp(x - max) / sum. The row was just read by this CTA: these loads hit in cache.
  for (int step = 0; step < steps; ++step) {
    Tensor tXgX = composition(gX(_, step), tv)(_, threadIdx.x, _);             // (VEC,ITER)
    Tensor tXgY = composition(gY(_, step), tv)(_, threadIdx.x, _);             // (VEC,ITER)
    if (kAligned && (step + 1) * kStep <= cols) {
      Tensor tXrX = make_tensor_like(tXgX);                                     // (VEC,ITER) registers
      copy(VecCopy{}, tXgX, tXrX);
      CUTE_UNROLL
      for (int i = 0; i < size(tXrX); ++i) tXrX(i) = expf(tXrX(i) - row_max) * inv_sum;
      copy(VecCopy{}, tXrX, tXgY);
    } else {
      Tensor tXcX = composition(cX(_, step), tv)(_, threadIdx.x, _);           // (VEC,ITER)
      CUTE_UNROLL
      for (int i = 0; i < size(tXgX); ++i) {
        if (elem_less(tXcX(i), make_shape(cols))) {
          tXgY(i) = expf(tXgX(i) - row_max) * inv_sum;
        }
      }
    }
  }
}

}  // namespace row_softmax_impl

extern "C" int row_softmax(float const* x, float* y, int64_t rows, int64_t cols, cudaStream_t stream) {
  using namespace row_softmax_impl;
  if (rows == 0 || cols == 0) return cudaSuccess;  // an empty grid is a launch error; nothing to do
  if (rows > INT32_MAX || cols > INT32_MAX - kStep) return cudaErrorInvalidValue;  // grid.x and int columns
  bool aligned = reinterpret_cast<uintptr_t>(x) % 16 == 0 && reinterpret_cast<uintptr_t>(y) % 16 == 0
                 && cols % kVec == 0;
  dim3 grid(static_cast<unsigned>(rows));  // one CTA per row
  if (aligned) {
    row_softmax_kernel<true><<<grid, kThreads, 0, stream>>>(x, y, int(cols));
  } else {
    row_softmax_kernel<false><<<grid, kThreads, 0, stream>>>(x, y, int(cols));
  }
  return cudaGetLastError();
}
"""

kernel = CuteKernel(CUDA_SRC, {"row_softmax": ("f32*", "f32*", "i64", "i64")}, name="row_softmax")


class ModelNew(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = torch.empty_like(x)
        cols = x.shape[-1]
        kernel.row_softmax(x, y, x.numel() // cols if cols else 0, cols)
        return y
