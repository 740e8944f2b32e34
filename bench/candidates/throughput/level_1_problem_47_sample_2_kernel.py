"""Hand-written honest candidate for the evaluator's throughput benchmark (not a model's output).

Task 47 (Sum reduction): y = torch.sum(x, dim, keepdim=True); the task reduces dim 1 of a (128, 4096, 4095) tensor.

x is viewed as (outer, reduce, inner) from its shape and the constructor's dim, and reduced over the
middle mode; any dim works. The op is sum, accumulated in double (each output sums thousands of values; a double accumulator
keeps the result within an fp32 rounding of the exact sum at no cost to this memory-bound loop).

Sample 2 -- split-reduce over separate CTAs, then a second pass. The reduced dimension is cut into
splits of kRowsPerSplit = 512 rows (8 for the task):
* reduce_split_partials: CTA (tile, split, outer) has 128 threads on 128 consecutive columns; each
  walks the split's rows down its column with kUnroll loads in flight (every warp load one 128-byte
  run) and writes its partial result to a workspace laid out (outer, split, inner), so the second
  pass reads it coalesced.
* reduce_split_combine: one thread per output combines the column's partials in split order (a
  fixed order: the result is deterministic) and applies the final step.
The work is spread over outer x tiles x splits CTAs (32768 for the task) of short, equal length,
whatever the balance of outer, reduce and inner. Cost: x read once, plus a workspace of
outer x splits x inner doubles written and read once (under 1% of x for the task).

How it differs from the other samples: sample 0 gives each column one thread walking all rows;
sample 1 splits the rows over the warps of one CTA and combines through shared memory.
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
namespace sum_dim_split_reduce_impl {

using namespace cute;

constexpr int kThreads      = 128;   // columns per CTA of the first pass
constexpr int kUnroll       = 8;     // loads in flight per thread
constexpr int kRowsPerSplit = 512;   // reduced rows per CTA of the first pass
constexpr int kCombineThreads = 256;
static_assert(kThreads % 32 == 0 && kCombineThreads % 32 == 0, "whole warps");
static_assert(kRowsPerSplit == 512, "the Python side sizes the workspace with ROWS_PER_SPLIT = 512");

using Acc = double;  // the partial results: double, see the module docstring

struct ReduceOp {
  __device__ __forceinline__ static Acc identity() { return 0.0; }
  __device__ __forceinline__ static Acc fold(Acc a, float v) { return a + double(v); }
  __device__ __forceinline__ static Acc combine(Acc a, Acc b) { return a + b; }
  __device__ __forceinline__ static float finish(Acc a, int64_t /*count*/) { return float(a); }
};

// Pass 1: block b = (o * splits + s) * tiles + tile.
__global__ void __launch_bounds__(kThreads)
reduce_split_partials(float const* __restrict__ x, Acc* __restrict__ ws, int64_t reduce, int64_t inner,
                      int64_t tiles, int64_t splits) {
  int64_t const tile = blockIdx.x % tiles;
  int64_t const os = blockIdx.x / tiles;  // o * splits + s
  int64_t const o = os / splits, s = os % splits;
  int64_t const c = tile * kThreads + threadIdx.x;
  if (c >= inner) return;  // residue columns: no barrier follows
  int64_t const r0 = s * kRowsPerSplit;
  int64_t const rows = min(int64_t(kRowsPerSplit), reduce - r0);  // 0 when reduce == 0 (one empty split)

  // int64 offsets: outer * reduce * inner exceeds 2^31 elements.
  auto row_major = make_layout(make_shape(rows, inner), make_stride(inner, Int<1>{}));  // (ROWS,INNER):(INNER,_1)
  Tensor mX   = make_tensor(make_gmem_ptr(x + (o * reduce + r0) * inner), row_major);    // (ROWS,INNER)
  Tensor gCol = mX(_, c);                                                               // (ROWS)

  Acc part[kUnroll];
  CUTE_UNROLL
  for (int u = 0; u < kUnroll; ++u) part[u] = ReduceOp::identity();
  int64_t r = 0;
  for (; r + kUnroll <= rows; r += kUnroll) {
    float v[kUnroll];
    CUTE_UNROLL
    for (int u = 0; u < kUnroll; ++u) v[u] = gCol(r + u);  // all loads first
    CUTE_UNROLL
    for (int u = 0; u < kUnroll; ++u) part[u] = ReduceOp::fold(part[u], v[u]);
  }
  for (; r < rows; ++r) part[0] = ReduceOp::fold(part[0], gCol(r));
  Acc acc = part[0];
  CUTE_UNROLL
  for (int u = 1; u < kUnroll; ++u) acc = ReduceOp::combine(acc, part[u]);
  ws[os * inner + c] = acc;  // workspace (OUTER,SPLIT,INNER)
}

// Pass 2: output (o, c) for block b = o * ctiles + ctile.
__global__ void __launch_bounds__(kCombineThreads)
reduce_split_combine(Acc const* __restrict__ ws, float* __restrict__ y, int64_t reduce, int64_t inner,
                     int64_t ctiles, int64_t splits) {
  int64_t const o = blockIdx.x / ctiles;
  int64_t const c = (blockIdx.x % ctiles) * kCombineThreads + threadIdx.x;
  if (c >= inner) return;
  auto ws_layout = make_layout(make_shape(splits, inner), make_stride(inner, Int<1>{}));  // (SPLIT,INNER):(INNER,_1)
  Tensor gWs = make_tensor(make_gmem_ptr(ws + o * splits * inner), ws_layout);            // (SPLIT,INNER)
  Acc acc = gWs(0, c);
  for (int64_t s = 1; s < splits; ++s) acc = ReduceOp::combine(acc, gWs(s, c));
  y[o * inner + c] = ReduceOp::finish(acc, reduce);
}

}  // namespace sum_dim_split_reduce_impl

// x: (outer, reduce, inner) contiguous; y: (outer, inner); ws: at least outer * max(1, ceil(reduce / 512)) * inner.
extern "C" int sum_dim(float const* x, double* ws, float* y, int64_t outer, int64_t reduce, int64_t inner,
                      cudaStream_t stream) {
  using namespace sum_dim_split_reduce_impl;
  if (outer == 0 || inner == 0) return cudaSuccess;  // no output; an empty grid is a launch error
  int64_t const splits = reduce > 0 ? (reduce + kRowsPerSplit - 1) / kRowsPerSplit : 1;  // 1 empty split: identity
  int64_t const tiles = (inner + kThreads - 1) / kThreads;
  int64_t const ctiles = (inner + kCombineThreads - 1) / kCombineThreads;
  if (outer > INT32_MAX / (tiles * splits)) return cudaErrorInvalidValue;  // grid.x of pass 1
  reduce_split_partials<<<unsigned(outer * splits * tiles), kThreads, 0, stream>>>(x, ws, reduce, inner, tiles, splits);
  reduce_split_combine<<<unsigned(outer * ctiles), kCombineThreads, 0, stream>>>(ws, y, reduce, inner, ctiles, splits);
  return cudaGetLastError();
}
"""

kernel = CuteKernel(CUDA_SRC, {"sum_dim": ("f32*", "f64*", "f32*", "i64", "i64", "i64")}, name="sum_dim_split_reduce")

ROWS_PER_SPLIT = 512  # kRowsPerSplit in the source: the workspace holds one partial per split


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
        splits = max(1, (reduce + ROWS_PER_SPLIT - 1) // ROWS_PER_SPLIT)
        workspace = torch.empty(max(1, outer * splits * inner), dtype=torch.float64, device=x.device)
        kernel.sum_dim(x, workspace, y, outer, reduce, inner)
        return y
