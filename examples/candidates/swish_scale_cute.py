"""Worked example candidate for examples/tasks/swish_scale.py: y = x * sigmoid(x) * scale.

One CuTe kernel, memory-bound: each element is read once and written once, so the work is to move
bytes at full bandwidth. Each thread moves 128-bit vectors (4 floats) and several of them per tile,
so a warp touches whole contiguous 512-byte runs (coalesced) and many loads are in flight at once.
Full tiles take the vector path; the one residue tile (numel not a multiple of the tile) and
misaligned pointers (a view starting mid-vector) take a predicated scalar path.
"""

import torch
import torch.nn as nn

from cutegen.runtime import CuteKernel

CUDA_SRC = r"""
#include <cstdint>
#include <cuda_runtime.h>
#include <cute/tensor.hpp>

// A named namespace, not an anonymous one: nvcc's generated host stubs cannot name kernels declared
// in an anonymous namespace when `using namespace cute` is also in scope.
namespace swish_scale_impl {

using namespace cute;

constexpr int kThreads = 256;                     // threads per block
constexpr int kVec     = 4;                       // floats per 128-bit access
constexpr int kIters   = 4;                       // vectors per thread per tile: more bytes in flight
constexpr int kTile    = kVec * kThreads * kIters; // elements per block tile

static_assert(sizeof(float) * kVec == 16, "a vector must be exactly one 128-bit access");
static_assert(kThreads % 32 == 0, "whole warps only, so each warp access is one contiguous run");

// Same operation order as PyTorch (sigmoid, then x * s, then * scale), so results match to an ulp.
__device__ __forceinline__ float swish_scale_op(float v, float scale) {
  float s = 1.0f / (1.0f + expf(-v));
  return (v * s) * scale;
}

// kAligned: both pointers are 16-byte aligned, so full tiles may use 128-bit accesses.
template <bool kAligned>
__global__ void __launch_bounds__(kThreads)
swish_scale_kernel(float const* __restrict__ x, float* __restrict__ y, int64_t n, float scale) {
  Tensor mX = make_tensor(make_gmem_ptr(x), make_layout(make_shape(n)));         // (N)
  Tensor mY = make_tensor(make_gmem_ptr(y), make_layout(make_shape(n)));         // (N)
  Tensor gX = local_tile(mX, Shape<Int<kTile>>{}, make_coord(blockIdx.x));      // (TILE)
  Tensor gY = local_tile(mY, Shape<Int<kTile>>{}, make_coord(blockIdx.x));      // (TILE)

  // Thread-value layout of a tile: thread t owns kIters vectors of kVec contiguous floats; neighbouring
  // threads own neighbouring vectors, so a warp's access at each iteration is contiguous.
  auto tv = make_layout(make_shape(Int<kVec>{}, Int<kThreads>{}, Int<kIters>{})); // (VEC,THR,ITER):(_1,VEC,VEC*THR)
  Tensor tXgX = composition(gX, tv)(_, threadIdx.x, _);                          // (VEC,ITER)
  Tensor tXgY = composition(gY, tv)(_, threadIdx.x, _);                          // (VEC,ITER)
  Tensor tXrX = make_tensor_like(tXgX);                                          // (VEC,ITER) registers

  bool full_tile = int64_t(blockIdx.x + 1) * kTile <= n;
  if (kAligned && full_tile) {
    // One 128-bit load/store per (VEC) column: the copy atom moves exactly kVec floats as a uint128_t.
    using VecCopy = Copy_Atom<UniversalCopy<uint128_t>, float>;
    copy(VecCopy{}, tXgX, tXrX);
    CUTE_UNROLL
    for (int i = 0; i < size(tXrX); ++i) {
      tXrX(i) = swish_scale_op(tXrX(i), scale);
    }
    copy(VecCopy{}, tXrX, tXgY);
  } else {
    // Residue tile or misaligned pointers: element by element, predicated on the logical coordinate
    // (an identity tensor partitioned exactly like the data), so nothing past n is touched.
    Tensor cX   = local_tile(make_identity_tensor(shape(mX)), Shape<Int<kTile>>{}, make_coord(blockIdx.x)); // (TILE)
    Tensor tXcX = composition(cX, tv)(_, threadIdx.x, _);                        // (VEC,ITER)
    CUTE_UNROLL
    for (int i = 0; i < size(tXgX); ++i) {
      if (elem_less(tXcX(i), shape(mX))) {
        tXgY(i) = swish_scale_op(tXgX(i), scale);
      }
    }
  }
}

}  // namespace swish_scale_impl

extern "C" int swish_scale(float const* x, float* y, int64_t n, float scale, cudaStream_t stream) {
  using namespace swish_scale_impl;
  if (n == 0) return cudaSuccess;  // an empty grid is a launch error, and there is nothing to do
  int64_t blocks = (n + kTile - 1) / kTile;
  if (blocks > INT32_MAX) return cudaErrorInvalidValue;
  bool aligned = reinterpret_cast<uintptr_t>(x) % 16 == 0 && reinterpret_cast<uintptr_t>(y) % 16 == 0;
  dim3 const grid{unsigned(blocks)};  // braces, not parentheses: `dim3 grid(unsigned(blocks));` declares a function
  if (aligned) {
    swish_scale_kernel<true><<<grid, kThreads, 0, stream>>>(x, y, n, scale);
  } else {
    swish_scale_kernel<false><<<grid, kThreads, 0, stream>>>(x, y, n, scale);
  }
  return cudaGetLastError();
}
"""

kernel = CuteKernel(CUDA_SRC, {"swish_scale": ("f32*", "f32*", "i64", "f32")}, name="swish_scale")


class ModelNew(nn.Module):
    def __init__(self, scale: float):
        super().__init__()
        self.scale = scale

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = torch.empty_like(x)
        kernel.swish_scale(x, y, x.numel(), self.scale)
        return y
