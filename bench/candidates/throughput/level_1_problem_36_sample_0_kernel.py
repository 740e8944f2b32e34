"""Hand-written honest candidate for the evaluator's throughput benchmark (not a model's output).

Task 36 (RMSNorm): y = x / sqrt(mean(x^2, dim=1, keepdim=True) + eps) for x of shape
(batch, features, *) = (112, 64, 512, 512): a reduction over the feature dimension, whose elements
lie inner = 512 * 512 floats apart (a strided reduction, not a row reduction).

x is viewed as (outer, features, inner) = (112, 64, 262144). Sample 0 -- one thread per (outer,
inner) column with the whole column in registers. A CTA of 256 threads covers 256 consecutive
columns of one outer index; each thread issues all `features` loads of its column at once (up to
kMaxF = 64 registers, the column length a compile-time bound picked by the launcher from 8, 16, 32,
64), sums the squares in fp32, and writes x / rms from the same registers. Consecutive threads read
consecutive floats of one feature plane, so every warp access is one 128-byte run. x is read once
and y written once, with no shared memory and no barrier. More than 64 features take a streaming
variant (sum of squares, then a second walk that re-reads the column).

How it differs from the other samples: sample 1 stages a (features x 128 columns) tile in shared
memory with 128-bit cp.async and splits the reduction over 8 warps; sample 2 is two kernels, one
writing the rms of every column to a workspace and an elementwise kernel over feature rows.
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
namespace rms_norm_columns_impl {

using namespace cute;

constexpr int kThreads = 256;  // columns per CTA, one per thread
constexpr int kMaxF    = 64;   // longest column kept in registers
constexpr int kUnroll  = 8;    // streaming variant: loads in flight per thread
static_assert(kThreads % 32 == 0, "whole warps: each warp reads 32 consecutive floats of a feature plane");

// Register variant: features <= kF. The column's values stay in registers from load to store.
template <int kF>
__global__ void __launch_bounds__(kThreads)
rms_norm_regs_kernel(float const* __restrict__ x, float* __restrict__ y, int features, int64_t inner,
                     int64_t tiles, float eps) {
  static_assert(kF <= kMaxF, "the column must fit the register budget");
  int64_t const o = blockIdx.x / tiles;
  int64_t const c = (blockIdx.x % tiles) * kThreads + threadIdx.x;
  if (c >= inner) return;  // the residue tile: no barrier follows

  // int64 offsets: the tensor has more than 2^31 elements.
  auto plane_major = make_layout(make_shape(features, inner), make_stride(inner, Int<1>{}));
  Tensor mX = make_tensor(make_gmem_ptr(x + o * features * inner), plane_major);  // (FEATURES,INNER)
  Tensor mY = make_tensor(make_gmem_ptr(y + o * features * inner), plane_major);  // (FEATURES,INNER)
  Tensor gX = mX(_, c);                                                           // (FEATURES)
  Tensor gY = mY(_, c);                                                           // (FEATURES)
  Tensor rX = make_tensor<float>(Shape<Int<kF>>{});                               // (KF) registers

  CUTE_UNROLL
  for (int f = 0; f < kF; ++f) rX(f) = f < features ? gX(f) : 0.0f;  // all loads in flight at once
  float sumsq = 0.0f;
  CUTE_UNROLL
  for (int f = 0; f < kF; ++f) sumsq += rX(f) * rX(f);
  // PyTorch's formula: sqrt(mean + eps), then a true division.
  float const rms = sqrtf(sumsq / float(features) + eps);
  CUTE_UNROLL
  for (int f = 0; f < kF; ++f) {
    if (f < features) gY(f) = rX(f) / rms;
  }
}

// Streaming variant, any number of features: sum of squares, then re-read and divide.
__global__ void __launch_bounds__(kThreads)
rms_norm_stream_kernel(float const* __restrict__ x, float* __restrict__ y, int64_t features, int64_t inner,
                       int64_t tiles, float eps) {
  int64_t const o = blockIdx.x / tiles;
  int64_t const c = (blockIdx.x % tiles) * kThreads + threadIdx.x;
  if (c >= inner) return;
  auto plane_major = make_layout(make_shape(features, inner), make_stride(inner, Int<1>{}));
  Tensor gX = make_tensor(make_gmem_ptr(x + o * features * inner), plane_major)(_, c);  // (FEATURES)
  Tensor gY = make_tensor(make_gmem_ptr(y + o * features * inner), plane_major)(_, c);  // (FEATURES)
  float part[kUnroll];
  CUTE_UNROLL
  for (int u = 0; u < kUnroll; ++u) part[u] = 0.0f;
  int64_t f = 0;
  for (; f + kUnroll <= features; f += kUnroll) {
    float v[kUnroll];
    CUTE_UNROLL
    for (int u = 0; u < kUnroll; ++u) v[u] = gX(f + u);
    CUTE_UNROLL
    for (int u = 0; u < kUnroll; ++u) part[u] += v[u] * v[u];
  }
  for (; f < features; ++f) part[0] += gX(f) * gX(f);
  float sumsq = 0.0f;
  CUTE_UNROLL
  for (int u = 0; u < kUnroll; ++u) sumsq += part[u];
  float const rms = sqrtf(sumsq / float(features) + eps);
  for (int64_t g = 0; g < features; ++g) gY(g) = gX(g) / rms;
}

template <int kF>
void launch_regs(float const* x, float* y, int64_t outer, int64_t features, int64_t inner, int64_t tiles,
                 float eps, cudaStream_t stream) {
  rms_norm_regs_kernel<kF><<<unsigned(outer * tiles), kThreads, 0, stream>>>(x, y, int(features), inner, tiles, eps);
}

}  // namespace rms_norm_columns_impl

// x, y: (outer, features, inner) contiguous; y = x / sqrt(mean over features of x^2 + eps).
extern "C" int rms_norm(float const* x, float* y, int64_t outer, int64_t features, int64_t inner, float eps,
                        cudaStream_t stream) {
  using namespace rms_norm_columns_impl;
  if (outer == 0 || features == 0 || inner == 0) return cudaSuccess;  // nothing to write
  int64_t const tiles = (inner + kThreads - 1) / kThreads;
  if (outer > INT32_MAX / tiles) return cudaErrorInvalidValue;  // grid.x = outer * tiles
  if (features <= 8)           launch_regs<8>(x, y, outer, features, inner, tiles, eps, stream);
  else if (features <= 16)     launch_regs<16>(x, y, outer, features, inner, tiles, eps, stream);
  else if (features <= 32)     launch_regs<32>(x, y, outer, features, inner, tiles, eps, stream);
  else if (features <= kMaxF)  launch_regs<kMaxF>(x, y, outer, features, inner, tiles, eps, stream);
  else rms_norm_stream_kernel<<<unsigned(outer * tiles), kThreads, 0, stream>>>(x, y, features, inner, tiles, eps);
  return cudaGetLastError();
}
"""

kernel = CuteKernel(CUDA_SRC, {"rms_norm": ("f32*", "f32*", "i64", "i64", "i64", "f32")}, name="rms_norm_columns")


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
        y = torch.empty_like(x)
        kernel.rms_norm(x, y, outer, features, inner, float(self.eps))
        return y
