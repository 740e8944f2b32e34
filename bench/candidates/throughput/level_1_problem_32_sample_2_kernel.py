"""Hand-written honest candidate for the evaluator's throughput benchmark (not a model's output).

KernelBench level 1, task 32_HardTanh: HardTanh (min_val = -1, max_val = 1), y = min(max(x,
min_val), max_val), elementwise, the same fp32 expression as PyTorch's CUDA kernel for F.hardtanh(x,
min_val=-1., max_val=1.). The task's x is 4096 x 393216 fp32 (1.6e9 elements, past 2^31), so sizes,
tile coordinates and element indices are all 64-bit. Memory-bound: each element is read once and
written once, so the work is moving bytes at full bandwidth with coalesced 128-bit accesses and
enough loads in flight.

Sample 2 of 3: wide tiles, 16384 elements per CTA (512 threads x 8 vectors of 128 bits, 128 bytes
in flight per thread), and a launcher that splits the work instead of predicating inside the tile:
the body kernel sees only full tiles of 16-byte-aligned data and has no bounds test or branch at
all; the residue (fewer than 16384 elements), or the whole tensor when a pointer is misaligned, goes
to a second, scalar grid-stride kernel bounded by its loop condition. (Sample 0: one 4096-element
tile per CTA with an identity-tensor predicate; sample 1: a persistent occupancy-sized grid over
2048-element tiles with copy_if predicate fragments.)
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
namespace hardtanh_wide_impl {

using namespace cute;

constexpr int kThreads     = 512;                      // threads per CTA of the body kernel
constexpr int kVec         = 4;                        // floats per 128-bit access
constexpr int kIters       = 8;                        // vectors per thread: 128 bytes in flight each
constexpr int kTile        = kVec * kThreads * kIters; // elements per body tile (16384)
constexpr int kTailThreads = 256;                      // threads per CTA of the scalar kernel
constexpr int kTailCtasPerSm = 8;                      // 8 x 256 = 2048, a full SM of threads

static_assert(sizeof(float) * kVec == 16, "a vector must be exactly one 128-bit access");
static_assert(kThreads % 32 == 0 && kTailThreads % 32 == 0, "whole warps only, for contiguous warp runs");
static_assert(kVec * kIters <= 32, "data registers per thread must stay well under the 128 that 512 threads allow");
static_assert(kTailThreads * kTailCtasPerSm <= 2048, "no more resident threads than an SM holds");

// F.hardtanh is clamp(x, min_val, max_val) on CUDA, which returns NaN for NaN; fmaxf/fminf alone would
// replace a NaN by a bound, so NaN is passed through first.
struct HardTanhOp {
  float min_val;
  float max_val;
  __device__ __forceinline__ float operator()(float v) const {
    return v != v ? v : fminf(fmaxf(v, min_val), max_val);
  }
};

// Body: full tiles of 16-byte-aligned data only (the launcher guarantees both), so the hot path has
// no bounds test, no branch, and its loads are issued back to back.
template <class Op>
__global__ void __launch_bounds__(kThreads)
hardtanh_wide_body_kernel(float const* __restrict__ x, float* __restrict__ y, int64_t n_full, Op op) {
  Tensor mX = make_tensor(make_gmem_ptr(x), make_layout(make_shape(n_full)));      // (N_FULL)
  Tensor mY = make_tensor(make_gmem_ptr(y), make_layout(make_shape(n_full)));      // (N_FULL)

  // Widened before CuTe scales it by kTile: blockIdx.x * kTile in 32 bits wraps past 2^32 elements.
  int64_t const tile = int64_t(blockIdx.x);
  Tensor gX = local_tile(mX, Shape<Int<kTile>>{}, make_coord(tile));              // (TILE)
  Tensor gY = local_tile(mY, Shape<Int<kTile>>{}, make_coord(tile));              // (TILE)

  // Thread-value layout: thread t owns kIters vectors of kVec contiguous floats, neighbouring threads
  // neighbouring vectors, so at each iteration a warp writes one contiguous 512-byte run.
  auto tv = make_layout(make_shape(Int<kVec>{}, Int<kThreads>{}, Int<kIters>{}));  // (VEC,THR,ITER):(_1,VEC,VEC*THR)
  Tensor tXgX = composition(gX, tv)(_, threadIdx.x, _);                            // (VEC,ITER)
  Tensor tXgY = composition(gY, tv)(_, threadIdx.x, _);                            // (VEC,ITER)
  Tensor tXrX = make_fragment_like(tXgX);                                          // (VEC,ITER) registers

  using VecCopy = Copy_Atom<UniversalCopy<uint128_t>, float>;
  copy(VecCopy{}, tXgX, tXrX);
  transform(tXrX, op);
  copy(VecCopy{}, tXrX, tXgY);
}

// Elements [begin, n): the residue after the body's full tiles, or everything when a pointer is not
// 16-byte aligned. One float per thread per turn, guarded by the loop bound alone; a warp's accesses
// are still 128 contiguous bytes, so even the whole-tensor fallback runs near bandwidth.
template <class Op>
__global__ void __launch_bounds__(kTailThreads)
hardtanh_wide_tail_kernel(float const* __restrict__ x, float* __restrict__ y, int64_t begin, int64_t n, Op op) {
  Tensor mX = make_tensor(make_gmem_ptr(x), make_layout(make_shape(n)));           // (N)
  Tensor mY = make_tensor(make_gmem_ptr(y), make_layout(make_shape(n)));           // (N)
  int64_t const stride = int64_t(gridDim.x) * kTailThreads;
  for (int64_t i = begin + int64_t(blockIdx.x) * kTailThreads + threadIdx.x; i < n; i += stride) {
    mY(i) = op(mX(i));
  }
}

}  // namespace hardtanh_wide_impl

extern "C" int hardtanh_wide(float const* x, float* y, int64_t n, float min_val, float max_val, cudaStream_t stream) {
  using namespace hardtanh_wide_impl;
  if (n < 0) return cudaErrorInvalidValue;
  if (n == 0) return cudaSuccess;  // an empty grid is a launch error, and there is nothing to do
  HardTanhOp const op{min_val, max_val};
  bool const aligned = reinterpret_cast<uintptr_t>(x) % 16 == 0 && reinterpret_cast<uintptr_t>(y) % 16 == 0;

  // Misaligned pointers cannot use 128-bit accesses anywhere (x and y may be off by different amounts),
  // so the body takes nothing and the scalar kernel takes it all.
  int64_t const full_tiles = aligned ? n / kTile : 0;
  int64_t const n_full     = full_tiles * kTile;
  if (full_tiles > 0) {
    if (full_tiles > INT32_MAX) return cudaErrorInvalidValue;  // gridDim.x holds at most 2^31 - 1
    dim3 const grid{unsigned(full_tiles)};
    dim3 const block{unsigned(kThreads)};
    hardtanh_wide_body_kernel<HardTanhOp><<<grid, block, 0, stream>>>(x, y, n_full, op);
    cudaError_t const err = cudaGetLastError();
    if (err != cudaSuccess) return err;
  }
  if (n_full < n) {
    int device = 0, sms = 0;
    cudaError_t err = cudaGetDevice(&device);
    if (err != cudaSuccess) return err;
    err = cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device);
    if (err != cudaSuccess) return err;
    // One full wave at most: the grid-stride loop covers the rest, and the cap keeps the grid small.
    int64_t const rest   = n - n_full;
    int64_t const needed = rest / kTailThreads + (rest % kTailThreads != 0);
    int64_t const wave   = int64_t(sms) * kTailCtasPerSm;
    int64_t const blocks = needed < wave ? needed : wave;
    if (blocks > INT32_MAX) return cudaErrorInvalidValue;
    dim3 const grid{unsigned(blocks)};
    dim3 const block{unsigned(kTailThreads)};
    hardtanh_wide_tail_kernel<HardTanhOp><<<grid, block, 0, stream>>>(x, y, n_full, n, op);
  }
  return cudaGetLastError();
}
"""

kernel = CuteKernel(CUDA_SRC, {"hardtanh_wide": ("f32*", "f32*", "i64", "f32", "f32")}, name="hardtanh_wide")


class ModelNew(nn.Module):
    def __init__(self):
        super().__init__()
        self.min_val = -1.0  # the bounds the task's forward passes to F.hardtanh
        self.max_val = 1.0

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x.contiguous()  # the kernel walks x as one flat array (a no-op for the task's inputs)
        y = torch.empty_like(x)
        kernel.hardtanh_wide(x, y, x.numel(), self.min_val, self.max_val)
        return y
