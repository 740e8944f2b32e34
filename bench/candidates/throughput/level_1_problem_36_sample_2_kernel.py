"""Hand-written honest candidate for the evaluator's throughput benchmark (not a model's output).

Task 36 (RMSNorm): y = x / sqrt(mean(x^2, dim=1, keepdim=True) + eps) for x of shape
(batch, features, *) = (112, 64, 512, 512): a reduction over the feature dimension, whose elements
lie inner = 512 * 512 floats apart (a strided reduction, not a row reduction).

x is viewed as (outer, features, inner) = (112, 64, 262144). Sample 2 -- reduce, then broadcast,
as two kernels:
* rms_norm_column_rms: one thread per (outer, inner) column walks the features with kUnroll loads
  in flight and kUnroll independent partial sums, and writes the column's rms to a workspace of
  outer x inner floats (1/64 of x for the task).
* rms_norm_apply: an elementwise kernel over the feature rows of x: the grid is (row tiles,
  features, outer), so no thread divides an index, and each thread moves kIters 128-bit vectors of
  one feature row, dividing by the matching 128-bit vector of rms values. For a fixed outer index
  all features reuse the same 1 MB rms row, which stays in L2. Rows whose length is not a multiple
  of 4, or unaligned tensors, use a scalar instance of the same kernel.
Cost: x read twice (kernel 1 streams all of x before kernel 2 starts), y written once, plus the
rms workspace written once and read from L2.

How it differs from the other samples: sample 0 is one fused kernel with each column in registers;
sample 1 stages (features x 128) tiles in shared memory with cp.async and splits the reduction over
8 warps. Both of those read x once.
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
namespace rms_norm_two_pass_impl {

using namespace cute;

constexpr int kThreads = 256;
constexpr int kUnroll  = 8;       // kernel 1: loads in flight per thread
constexpr int kIters   = 4;       // kernel 2: vectors in flight per thread
constexpr int kMaxGrid = 65535;   // grid.y / grid.z limit: larger extents loop
static_assert(kThreads % 32 == 0, "whole warps");

// Kernel 1: rms of column c of outer index o, for block (tile, o) = (blockIdx.x % tiles, blockIdx.x / tiles).
__global__ void __launch_bounds__(kThreads)
rms_norm_column_rms(float const* __restrict__ x, float* __restrict__ rms, int64_t features, int64_t inner,
                    int64_t tiles, float eps) {
  int64_t const o = blockIdx.x / tiles;
  int64_t const c = (blockIdx.x % tiles) * kThreads + threadIdx.x;
  if (c >= inner) return;  // residue columns: no barrier follows
  // int64 offsets: the tensor has more than 2^31 elements.
  auto plane_major = make_layout(make_shape(features, inner), make_stride(inner, Int<1>{}));
  Tensor gX = make_tensor(make_gmem_ptr(x + o * features * inner), plane_major)(_, c);  // (FEATURES)
  float part[kUnroll];
  CUTE_UNROLL
  for (int u = 0; u < kUnroll; ++u) part[u] = 0.0f;
  int64_t f = 0;
  for (; f + kUnroll <= features; f += kUnroll) {
    float v[kUnroll];
    CUTE_UNROLL
    for (int u = 0; u < kUnroll; ++u) v[u] = gX(f + u);  // all loads first
    CUTE_UNROLL
    for (int u = 0; u < kUnroll; ++u) part[u] += v[u] * v[u];
  }
  for (; f < features; ++f) {
    float const v = gX(f);
    part[0] += v * v;
  }
  float sumsq = 0.0f;
  CUTE_UNROLL
  for (int u = 0; u < kUnroll; ++u) sumsq += part[u];
  rms[o * inner + c] = sqrtf(sumsq / float(features) + eps);  // PyTorch's formula
}

// Kernel 2: y[o, f, :] = x[o, f, :] / rms[o, :], kVec floats per access (4 needs inner % 4 == 0
// and 16-byte aligned tensors).
template <int kVec>
__global__ void __launch_bounds__(kThreads)
rms_norm_apply(float const* __restrict__ x, float const* __restrict__ rms, float* __restrict__ y,
               int64_t outer, int64_t features, int64_t inner) {
  using VecCopy = Copy_Atom<UniversalCopy<conditional_t<kVec == 4, uint128_t, uint32_t>>, float>;
  int64_t const nvec = inner / kVec;
  int64_t const first = int64_t(blockIdx.x) * kThreads * kIters + threadIdx.x;
  auto row_vecs = make_layout(make_shape(Int<kVec>{}, nvec));  // (VEC,NVEC):(_1,VEC)
  for (int64_t o = blockIdx.z; o < outer; o += gridDim.z) {
    Tensor gR = make_tensor(make_gmem_ptr(rms + o * inner), row_vecs);                       // (VEC,NVEC)
    for (int64_t f = blockIdx.y; f < features; f += gridDim.y) {
      Tensor gX = make_tensor(make_gmem_ptr(x + (o * features + f) * inner), row_vecs);      // (VEC,NVEC)
      Tensor gY = make_tensor(make_gmem_ptr(y + (o * features + f) * inner), row_vecs);      // (VEC,NVEC)
      Tensor rX = make_tensor<float>(Shape<Int<kVec>, Int<kIters>>{});                      // (VEC,ITER) registers
      Tensor rR = make_tensor<float>(Shape<Int<kVec>, Int<kIters>>{});                      // (VEC,ITER) registers
      CUTE_UNROLL
      for (int it = 0; it < kIters; ++it) {  // all loads first
        int64_t const v = first + it * kThreads;
        if (v < nvec) {
          copy(VecCopy{}, gX(_, v), rX(_, it));
          copy(VecCopy{}, gR(_, v), rR(_, it));
        }
      }
      CUTE_UNROLL
      for (int it = 0; it < kIters; ++it) {
        int64_t const v = first + it * kThreads;
        if (v < nvec) {
          CUTE_UNROLL
          for (int j = 0; j < kVec; ++j) rX(j, it) = rX(j, it) / rR(j, it);
          copy(VecCopy{}, rX(_, it), gY(_, v));
        }
      }
    }
  }
}

template <int kVec>
int launch_apply(float const* x, float const* rms, float* y, int64_t outer, int64_t features, int64_t inner,
                 cudaStream_t stream) {
  int64_t const row_ctas = (inner / kVec + kThreads * kIters - 1) / (kThreads * kIters);
  if (row_ctas > INT32_MAX) return cudaErrorInvalidValue;
  dim3 const grid{unsigned(row_ctas), unsigned(min(features, int64_t(kMaxGrid))), unsigned(min(outer, int64_t(kMaxGrid)))};
  rms_norm_apply<kVec><<<grid, kThreads, 0, stream>>>(x, rms, y, outer, features, inner);
  return cudaGetLastError();
}

}  // namespace rms_norm_two_pass_impl

// x, y: (outer, features, inner) contiguous; rms: workspace of outer * inner floats.
extern "C" int rms_norm(float const* x, float* rms, float* y, int64_t outer, int64_t features, int64_t inner,
                        float eps, cudaStream_t stream) {
  using namespace rms_norm_two_pass_impl;
  if (outer == 0 || features == 0 || inner == 0) return cudaSuccess;  // nothing to write
  int64_t const tiles = (inner + kThreads - 1) / kThreads;
  if (outer > INT32_MAX / tiles) return cudaErrorInvalidValue;  // grid.x of kernel 1
  rms_norm_column_rms<<<unsigned(outer * tiles), kThreads, 0, stream>>>(x, rms, features, inner, tiles, eps);
  bool const vec_ok = inner % 4 == 0 && reinterpret_cast<uintptr_t>(x) % 16 == 0 &&
                      reinterpret_cast<uintptr_t>(rms) % 16 == 0 && reinterpret_cast<uintptr_t>(y) % 16 == 0;
  return vec_ok ? launch_apply<4>(x, rms, y, outer, features, inner, stream)
                : launch_apply<1>(x, rms, y, outer, features, inner, stream);
}
"""

kernel = CuteKernel(CUDA_SRC, {"rms_norm": ("f32*", "f32*", "f32*", "i64", "i64", "i64", "f32")}, name="rms_norm_two_pass")


class ModelNew(nn.Module):
    def __init__(self, num_features: int, eps: float = 1e-5):
        super().__init__()
        self.num_features = num_features
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.dim() < 2:
            raise NotImplementedError("RMSNorm over dim 1 needs a tensor of rank >= 2")
        x = x.contiguous()
        outer = x.shape[0]
        features = x.shape[1]
        inner = 1
        for size in x.shape[2:]:
            inner *= size
        rms = torch.empty(max(1, outer * inner), dtype=torch.float32, device=x.device)
        y = torch.empty_like(x)
        kernel.rms_norm(x, rms, y, outer, features, inner, float(self.eps))
        return y
