"""Hand-written honest candidate for the evaluator's throughput benchmark (not a model's output).

Task 48 (Mean reduction): y = torch.mean(x, dim) (no keepdim); the task reduces dim 1 of a (128, 4096, 4095) tensor.

x is viewed as (outer, reduce, inner) from its shape and the constructor's dim, and reduced over the
middle mode; any dim works. The op is mean: a sum accumulated in double, divided by the count in double and rounded once to
fp32 (an empty dimension gives 0/0 = NaN, as torch.mean does).

Sample 1 -- each column's reduction is split over the 8 warps of a CTA. A CTA of (32 columns x 8
slices) = 256 threads owns 32 consecutive columns of one outer index: warp w reduces rows w, w + 8,
w + 16, ... (kUnroll of them in flight, each warp load one 128-byte run of a row), then the 8
partial results of a column meet in shared memory and warp 0 combines them in slice order. A
thread walks only reduce / 8 rows, so 8x more CTAs (16384 for the task) share the work than with a
thread per column: short tails, and the latency of a long serial walk is hidden by more warps.
x is read exactly once; no workspace.

How it differs from the other samples: sample 0 gives each column one thread that walks all rows
(no combine); sample 2 splits the rows over separate CTAs with a workspace and a second kernel.
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
namespace mean_dim_cta_split_impl {

using namespace cute;

constexpr int kCols    = 32;              // columns per CTA: one per lane
constexpr int kSlices  = 8;               // warps per CTA, each a slice of the reduced rows
constexpr int kThreads = kCols * kSlices;
constexpr int kUnroll  = 4;               // rows in flight per thread
static_assert(kCols == 32, "a warp is one row segment of 32 columns: one 128-byte access");
static_assert(kSlices <= 32, "warp 0 combines the slices");

using Acc = double;  // the partial results: double, see the module docstring

struct ReduceOp {
  __device__ __forceinline__ static Acc identity() { return 0.0; }
  __device__ __forceinline__ static Acc fold(Acc a, float v) { return a + double(v); }
  __device__ __forceinline__ static Acc combine(Acc a, Acc b) { return a + b; }
  __device__ __forceinline__ static float finish(Acc a, int64_t count) { return float(a / double(count)); }
};

__global__ void __launch_bounds__(kThreads)
reduce_cta_split_kernel(float const* __restrict__ x, float* __restrict__ y, int64_t reduce, int64_t inner,
                        int64_t tiles) {
  __shared__ Acc sPart[kSlices][kCols];  // (SLICE,COL) partial results
  int const lane = threadIdx.x % kCols, slice = threadIdx.x / kCols;
  int64_t const o = blockIdx.x / tiles;
  int64_t const c = (blockIdx.x % tiles) * kCols + lane;
  bool const valid = c < inner;  // residue columns still reach the barrier below

  // int64 offsets: outer * reduce * inner exceeds 2^31 elements.
  auto row_major = make_layout(make_shape(reduce, inner), make_stride(inner, Int<1>{}));  // (REDUCE,INNER):(INNER,_1)
  Tensor mX = make_tensor(make_gmem_ptr(x + o * reduce * inner), row_major);              // (REDUCE,INNER)

  Acc acc = ReduceOp::identity();
  if (valid) {
    Tensor gCol = mX(_, c);  // (REDUCE)
    int64_t r = slice;
    for (; r + (kUnroll - 1) * kSlices < reduce; r += kUnroll * kSlices) {
      float v[kUnroll];
      CUTE_UNROLL
      for (int u = 0; u < kUnroll; ++u) v[u] = gCol(r + u * kSlices);  // all loads first
      CUTE_UNROLL
      for (int u = 0; u < kUnroll; ++u) acc = ReduceOp::fold(acc, v[u]);
    }
    for (; r < reduce; r += kSlices) acc = ReduceOp::fold(acc, gCol(r));
  }
  sPart[slice][lane] = acc;
  __syncthreads();
  if (slice == 0 && valid) {
    Acc total = sPart[0][lane];
    CUTE_UNROLL
    for (int s = 1; s < kSlices; ++s) total = ReduceOp::combine(total, sPart[s][lane]);
    y[o * inner + c] = ReduceOp::finish(total, reduce);
  }
}

}  // namespace mean_dim_cta_split_impl

// x: (outer, reduce, inner) contiguous; y: (outer, inner) contiguous.
extern "C" int mean_dim(float const* x, float* y, int64_t outer, int64_t reduce, int64_t inner, cudaStream_t stream) {
  using namespace mean_dim_cta_split_impl;
  if (outer == 0 || inner == 0) return cudaSuccess;  // no output; an empty grid is a launch error
  int64_t const tiles = (inner + kCols - 1) / kCols;
  if (outer > INT32_MAX / tiles) return cudaErrorInvalidValue;  // grid.x = outer * tiles
  reduce_cta_split_kernel<<<unsigned(outer * tiles), kThreads, 0, stream>>>(x, y, reduce, inner, tiles);
  return cudaGetLastError();
}
"""

kernel = CuteKernel(CUDA_SRC, {"mean_dim": ("f32*", "f32*", "i64", "i64", "i64")}, name="mean_dim_cta_split")


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
        out_shape = x.shape[:dim] + x.shape[dim + 1:]  # the reduced dimension is dropped
        y = torch.empty(out_shape, dtype=x.dtype, device=x.device)
        kernel.mean_dim(x, y, outer, reduce, inner)
        return y
