"""Hand-written honest candidate for the evaluator's throughput benchmark (not a model's output).

KernelBench level 1, task 29_Softplus: Softplus (beta = 1, threshold = 20), y = x * beta > threshold
? x : log1p(exp(x * beta)) / beta, elementwise, the same fp32 expression as PyTorch's CUDA kernel
for F.softplus(x) (beta=1, threshold=20). The task's x is 4096 x 393216 fp32 (1.6e9 elements, past
2^31), so sizes, tile coordinates and element indices are all 64-bit. Memory-bound: each element is
read once and written once, so the work is moving bytes at full bandwidth with coalesced 128-bit
accesses and enough loads in flight.

Sample 0 of 3: one 4096-element tile per CTA (256 threads x 4 vectors of 128 bits), a grid that
covers the tensor once. Full tiles of 16-byte-aligned data move 128-bit vectors; the residue tile
and misaligned pointers take an element-wise path predicated on an identity tensor, element by
element. (Sample 1: a persistent, occupancy-sized grid striding over 2048-element tiles with copy_if
predicate fragments; sample 2: 16384-element tiles of 512 threads x 8 vectors with no predicate at
all, the residue and misaligned inputs going to a separate scalar kernel.)
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
namespace softplus_tile_impl {

using namespace cute;

constexpr int kThreads = 256;                      // threads per CTA
constexpr int kVec     = 4;                        // floats per 128-bit access
constexpr int kIters   = 4;                        // vectors per thread: four 16-byte loads in flight each
constexpr int kTile    = kVec * kThreads * kIters; // elements per CTA tile (4096)

static_assert(sizeof(float) * kVec == 16, "a vector must be exactly one 128-bit access");
static_assert(kThreads % 32 == 0, "whole warps only, so each warp access is one contiguous 512-byte run");
static_assert(kTile == 4096, "the launcher's grid arithmetic assumes this tile");

// PyTorch's CUDA kernel, in fp32: above the threshold softplus(x) equals x to fp32 precision and
// exp(x) would overflow past 88; below it log1pf(expf(x)) stays accurate for very negative x, where
// logf(1 + expf(x)) loses every digit once expf(x) < 2^-24. Dividing by beta = 1 is exact.
struct SoftplusOp {
  float beta;
  float threshold;
  __device__ __forceinline__ float operator()(float v) const {
    float const z = v * beta;
    return z > threshold ? v : log1pf(expf(z)) / beta;
  }
};

// kAligned: x and y are both 16-byte aligned, so full tiles may use 128-bit accesses.
template <class Op, bool kAligned>
__global__ void __launch_bounds__(kThreads)
softplus_tile_kernel(float const* __restrict__ x, float* __restrict__ y, int64_t n, Op op) {
  Tensor mX = make_tensor(make_gmem_ptr(x), make_layout(make_shape(n)));           // (N)
  Tensor mY = make_tensor(make_gmem_ptr(y), make_layout(make_shape(n)));           // (N)

  // Widened before CuTe scales it by kTile: blockIdx.x * kTile in 32 bits wraps past 2^32 elements.
  int64_t const tile = int64_t(blockIdx.x);
  Tensor gX = local_tile(mX, Shape<Int<kTile>>{}, make_coord(tile));              // (TILE)
  Tensor gY = local_tile(mY, Shape<Int<kTile>>{}, make_coord(tile));              // (TILE)

  // Thread-value layout: thread t owns kIters vectors of kVec contiguous floats, neighbouring threads
  // neighbouring vectors, so at each iteration a warp reads one contiguous 512-byte run.
  auto tv = make_layout(make_shape(Int<kVec>{}, Int<kThreads>{}, Int<kIters>{}));  // (VEC,THR,ITER):(_1,VEC,VEC*THR)
  Tensor tXgX = composition(gX, tv)(_, threadIdx.x, _);                            // (VEC,ITER)
  Tensor tXgY = composition(gY, tv)(_, threadIdx.x, _);                            // (VEC,ITER)
  Tensor tXrX = make_tensor_like(tXgX);                                            // (VEC,ITER) registers

  bool const full_tile = (tile + 1) * kTile <= n;
  if (kAligned && full_tile) {
    // All kIters loads are issued before any math, so each thread has 64 bytes in flight.
    using VecCopy = Copy_Atom<UniversalCopy<uint128_t>, float>;
    copy(VecCopy{}, tXgX, tXrX);
    CUTE_UNROLL
    for (int i = 0; i < size(tXrX); ++i) {
      tXrX(i) = op(tXrX(i));
    }
    copy(VecCopy{}, tXrX, tXgY);
  } else {
    // Residue tile or misaligned pointers: element by element, each tested against n through an
    // identity tensor partitioned exactly like the data, so nothing past the end is touched.
    Tensor cX   = local_tile(make_identity_tensor(shape(mX)), Shape<Int<kTile>>{}, make_coord(tile)); // (TILE)
    Tensor tXcX = composition(cX, tv)(_, threadIdx.x, _);                          // (VEC,ITER)
    CUTE_UNROLL
    for (int i = 0; i < size(tXgX); ++i) {
      if (elem_less(tXcX(i), shape(mX))) {
        tXgY(i) = op(tXgX(i));
      }
    }
  }
}

}  // namespace softplus_tile_impl

extern "C" int softplus_tile(float const* x, float* y, int64_t n, float beta, float threshold, cudaStream_t stream) {
  using namespace softplus_tile_impl;
  if (n < 0) return cudaErrorInvalidValue;
  if (n == 0) return cudaSuccess;  // an empty grid is a launch error, and there is nothing to do
  int64_t const blocks = n / kTile + (n % kTile != 0);  // no n + kTile - 1: it could overflow int64
  if (blocks > INT32_MAX) return cudaErrorInvalidValue;  // gridDim.x holds at most 2^31 - 1
  SoftplusOp const op{beta, threshold};
  bool const aligned = reinterpret_cast<uintptr_t>(x) % 16 == 0 && reinterpret_cast<uintptr_t>(y) % 16 == 0;
  dim3 const grid{unsigned(blocks)};
  dim3 const block{unsigned(kThreads)};
  if (aligned) {
    softplus_tile_kernel<SoftplusOp, true><<<grid, block, 0, stream>>>(x, y, n, op);
  } else {
    softplus_tile_kernel<SoftplusOp, false><<<grid, block, 0, stream>>>(x, y, n, op);
  }
  return cudaGetLastError();
}
"""

kernel = CuteKernel(CUDA_SRC, {"softplus_tile": ("f32*", "f32*", "i64", "f32", "f32")}, name="softplus_tile")


class ModelNew(nn.Module):
    def __init__(self):
        super().__init__()
        self.beta = 1.0  # F.softplus defaults, which the task uses
        self.threshold = 20.0

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x.contiguous()  # the kernel walks x as one flat array (a no-op for the task's inputs)
        y = torch.empty_like(x)
        kernel.softplus_tile(x, y, x.numel(), self.beta, self.threshold)
        return y
