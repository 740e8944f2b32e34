"""Hand-written honest candidate for the evaluator's throughput benchmark (not a model's output).

Task 47 (Sum reduction): y = torch.sum(x, dim, keepdim=True); the task reduces dim 1 of a (128, 4096, 4095) tensor.

x is viewed as (outer, reduce, inner) from its shape and the constructor's dim, and reduced over the
middle mode; any dim works. The op is sum, accumulated in double (each output sums thousands of values; a double accumulator
keeps the result within an fp32 rounding of the exact sum at no cost to this memory-bound loop).

Sample 0 -- one thread per output column, no cross-thread combine. A CTA of 256 threads covers 256
consecutive columns (inner indices) of one outer index, and each thread walks the whole reduced
dimension down its column (stride inner) with kUnroll loads in flight and kUnroll independent
partial results, combined in a fixed order at the end. Consecutive threads read consecutive floats
of the same row, so every warp load is one 128-byte run whatever inner's alignment (the task's
inner of 4095 rules out 128-bit vectors, which would need every row on a 16-byte boundary). x is
read exactly once; there is no shared memory, no barrier and no workspace.

How it differs from the other samples: sample 1 splits each column's reduction over the 8 warps of a
CTA and combines the 8 partials through shared memory; sample 2 splits it over separate CTAs that
write partials to a workspace, combined by a second kernel.
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
namespace sum_dim_columns_impl {

using namespace cute;

constexpr int kThreads = 256;  // columns per CTA
constexpr int kUnroll  = 8;    // loads in flight per thread, one partial result each
static_assert(kThreads % 32 == 0, "whole warps: each warp reads 32 consecutive floats of a row");

using Acc = double;  // the partial results: double, see the module docstring

struct ReduceOp {
  __device__ __forceinline__ static Acc identity() { return 0.0; }
  __device__ __forceinline__ static Acc fold(Acc a, float v) { return a + double(v); }
  __device__ __forceinline__ static Acc combine(Acc a, Acc b) { return a + b; }
  __device__ __forceinline__ static float finish(Acc a, int64_t /*count*/) { return float(a); }
};

// Column `tile * kThreads + thread` of outer index blockIdx.x / tiles.
__global__ void __launch_bounds__(kThreads)
reduce_columns_kernel(float const* __restrict__ x, float* __restrict__ y, int64_t reduce, int64_t inner,
                      int64_t tiles) {
  int64_t const o = blockIdx.x / tiles;
  int64_t const c = (blockIdx.x % tiles) * kThreads + threadIdx.x;
  if (c >= inner) return;  // the residue tile: no barrier follows

  // int64 offsets: outer * reduce * inner exceeds 2^31 elements.
  auto row_major = make_layout(make_shape(reduce, inner), make_stride(inner, Int<1>{}));  // (REDUCE,INNER):(INNER,_1)
  Tensor mX   = make_tensor(make_gmem_ptr(x + o * reduce * inner), row_major);            // (REDUCE,INNER)
  Tensor gCol = mX(_, c);                                                                 // (REDUCE)

  Acc part[kUnroll];
  CUTE_UNROLL
  for (int u = 0; u < kUnroll; ++u) part[u] = ReduceOp::identity();
  int64_t r = 0;
  for (; r + kUnroll <= reduce; r += kUnroll) {
    float v[kUnroll];
    CUTE_UNROLL
    for (int u = 0; u < kUnroll; ++u) v[u] = gCol(r + u);  // all loads first
    CUTE_UNROLL
    for (int u = 0; u < kUnroll; ++u) part[u] = ReduceOp::fold(part[u], v[u]);
  }
  for (; r < reduce; ++r) part[0] = ReduceOp::fold(part[0], gCol(r));  // the < kUnroll residue rows
  Acc acc = part[0];
  CUTE_UNROLL
  for (int u = 1; u < kUnroll; ++u) acc = ReduceOp::combine(acc, part[u]);
  y[o * inner + c] = ReduceOp::finish(acc, reduce);
}

}  // namespace sum_dim_columns_impl

// x: (outer, reduce, inner) contiguous; y: (outer, inner) contiguous.
extern "C" int sum_dim(float const* x, float* y, int64_t outer, int64_t reduce, int64_t inner, cudaStream_t stream) {
  using namespace sum_dim_columns_impl;
  if (outer == 0 || inner == 0) return cudaSuccess;  // no output; an empty grid is a launch error
  int64_t const tiles = (inner + kThreads - 1) / kThreads;
  if (outer > INT32_MAX / tiles) return cudaErrorInvalidValue;  // grid.x = outer * tiles
  reduce_columns_kernel<<<unsigned(outer * tiles), kThreads, 0, stream>>>(x, y, reduce, inner, tiles);
  return cudaGetLastError();
}
"""

kernel = CuteKernel(CUDA_SRC, {"sum_dim": ("f32*", "f32*", "i64", "i64", "i64")}, name="sum_dim_columns")


class ModelNew(nn.Module):
    def __init__(self, dim: int):
        super().__init__()
        self.dim = dim

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.dim() == 0:
            raise NotImplementedError("this kernel reduces one dimension of a tensor of rank >= 1")
        x = x.contiguous()
        dim = self.dim % x.dim()
        # x viewed as (outer, reduce, inner), reduced over the middle mode.
        outer = 1
        for size in x.shape[:dim]:
            outer *= size
        reduce = x.shape[dim]
        inner = 1
        for size in x.shape[dim + 1:]:
            inner *= size
        out_shape = x.shape[:dim] + (1,) + x.shape[dim + 1:]  # keepdim=True
        y = torch.empty(out_shape, dtype=x.dtype, device=x.device)
        kernel.sum_dim(x, y, outer, reduce, inner)
        return y
