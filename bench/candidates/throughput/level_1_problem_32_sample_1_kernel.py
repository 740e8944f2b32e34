"""Hand-written honest candidate for the evaluator's throughput benchmark (not a model's output).

KernelBench level 1, task 32_HardTanh: HardTanh (min_val = -1, max_val = 1), y = min(max(x,
min_val), max_val), elementwise, the same fp32 expression as PyTorch's CUDA kernel for F.hardtanh(x,
min_val=-1., max_val=1.). The task's x is 4096 x 393216 fp32 (1.6e9 elements, past 2^31), so sizes,
tile coordinates and element indices are all 64-bit. Memory-bound: each element is read once and
written once, so the work is moving bytes at full bandwidth with coalesced 128-bit accesses and
enough loads in flight.

Sample 1 of 3: a persistent grid sized from the occupancy calculator (resident CTAs per SM, capped at
8, times the SM count) whose CTAs stride over 2048-element tiles (256 threads x 2 vectors of 128
bits), so block scheduling and per-CTA setup are paid once per CTA, not once per tile. Full tiles of
16-byte-aligned data move 128-bit vectors; the residue tile and misaligned pointers build a
(VEC,ITER) predicate fragment once and use copy_if for both the load and the store. (Sample 0: one
4096-element tile per CTA, predicated element by element on an identity tensor; sample 2:
16384-element tiles of 512 threads x 8 vectors with no predicate at all and a separate scalar
kernel for the residue.)
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
namespace hardtanh_persistent_impl {

using namespace cute;

constexpr int kThreads     = 256;                      // threads per CTA
constexpr int kVec         = 4;                        // floats per 128-bit access
constexpr int kIters       = 2;                        // vectors per thread per tile
constexpr int kTile        = kVec * kThreads * kIters; // elements per tile (2048)
// Cap on resident CTAs per SM: 8 x 256 threads is Hopper's 2048-thread limit, enough warps to cover
// DRAM latency with two 16-byte loads each; more CTAs would only queue.
constexpr int kMaxCtasPerSm = 8;

static_assert(sizeof(float) * kVec == 16, "a vector must be exactly one 128-bit access");
static_assert(kThreads % 32 == 0, "whole warps only, so each warp access is one contiguous 512-byte run");
static_assert(kThreads * kMaxCtasPerSm <= 2048, "no more resident threads than an SM holds");

// F.hardtanh is clamp(x, min_val, max_val) on CUDA, which returns NaN for NaN; fmaxf/fminf alone would
// replace a NaN by a bound, so NaN is passed through first.
struct HardTanhOp {
  float min_val;
  float max_val;
  __device__ __forceinline__ float operator()(float v) const {
    return v != v ? v : fminf(fmaxf(v, min_val), max_val);
  }
};

// kAligned: x and y are both 16-byte aligned, so full tiles may use 128-bit accesses.
template <class Op, bool kAligned>
__global__ void __launch_bounds__(kThreads)
hardtanh_persistent_kernel(float const* __restrict__ x, float* __restrict__ y, int64_t n, Op op) {
  Tensor mX = make_tensor(make_gmem_ptr(x), make_layout(make_shape(n)));           // (N)
  Tensor mY = make_tensor(make_gmem_ptr(y), make_layout(make_shape(n)));           // (N)
  Tensor cX = make_identity_tensor(shape(mX));                                     // (N) -> n

  // Thread-value layout: thread t owns kIters vectors of kVec contiguous floats, neighbouring threads
  // neighbouring vectors, so at each iteration a warp reads one contiguous 512-byte run.
  auto tv = make_layout(make_shape(Int<kVec>{}, Int<kThreads>{}, Int<kIters>{}));  // (VEC,THR,ITER):(_1,VEC,VEC*THR)
  using VecCopy = Copy_Atom<UniversalCopy<uint128_t>, float>;

  int64_t const num_tiles = n / kTile + (n % kTile != 0);
  int64_t const num_full  = n / kTile;  // tiles before the residue: no bounds test needed there

  // 64-bit tile counter: CuTe scales it by kTile, which in 32 bits would wrap past 2^32 elements.
  for (int64_t tile = blockIdx.x; tile < num_tiles; tile += gridDim.x) {
    Tensor gX   = local_tile(mX, Shape<Int<kTile>>{}, make_coord(tile));          // (TILE)
    Tensor gY   = local_tile(mY, Shape<Int<kTile>>{}, make_coord(tile));          // (TILE)
    Tensor tXgX = composition(gX, tv)(_, threadIdx.x, _);                          // (VEC,ITER)
    Tensor tXgY = composition(gY, tv)(_, threadIdx.x, _);                          // (VEC,ITER)
    Tensor tXrX = make_tensor_like(tXgX);                                          // (VEC,ITER) registers

    if (kAligned && tile < num_full) {
      copy(VecCopy{}, tXgX, tXrX);
      transform(tXrX, op);
      copy(VecCopy{}, tXrX, tXgY);
    } else {
      // Residue tile or misaligned pointers: one predicate per value, computed once from the identity
      // tensor and used for both the load and the store (CUTLASS's predicate-fragment idiom).
      Tensor gC   = local_tile(cX, Shape<Int<kTile>>{}, make_coord(tile));        // (TILE) -> n
      Tensor tXcX = composition(gC, tv)(_, threadIdx.x, _);                        // (VEC,ITER) -> n
      Tensor tXpX = make_tensor<bool>(shape(tXcX));                               // (VEC,ITER) predicates
      CUTE_UNROLL
      for (int i = 0; i < size(tXpX); ++i) {
        tXpX(i) = elem_less(tXcX(i), shape(mX));
      }
      clear(tXrX);  // lanes past n are never stored; zeroed so op never reads uninitialised registers
      copy_if(tXpX, tXgX, tXrX);
      transform(tXrX, op);
      copy_if(tXpX, tXrX, tXgY);
    }
  }
}

}  // namespace hardtanh_persistent_impl

extern "C" int hardtanh_persistent(float const* x, float* y, int64_t n, float min_val, float max_val, cudaStream_t stream) {
  using namespace hardtanh_persistent_impl;
  if (n < 0) return cudaErrorInvalidValue;
  if (n == 0) return cudaSuccess;  // an empty grid is a launch error, and there is nothing to do
  HardTanhOp const op{min_val, max_val};
  bool const aligned = reinterpret_cast<uintptr_t>(x) % 16 == 0 && reinterpret_cast<uintptr_t>(y) % 16 == 0;
  auto const kernel = aligned ? &hardtanh_persistent_kernel<HardTanhOp, true> : &hardtanh_persistent_kernel<HardTanhOp, false>;

  // Grid = resident CTAs per SM (from the occupancy calculator, capped) x SMs: one wave, every CTA
  // looping over tiles, so no CTA waits in a second wave.
  int device = 0, sms = 0, per_sm = 0;
  cudaError_t err = cudaGetDevice(&device);
  if (err != cudaSuccess) return err;
  err = cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device);
  if (err != cudaSuccess) return err;
  err = cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, kernel, kThreads, 0);
  if (err != cudaSuccess) return err;
  per_sm = per_sm < 1 ? 1 : (per_sm > kMaxCtasPerSm ? kMaxCtasPerSm : per_sm);

  int64_t const tiles  = n / kTile + (n % kTile != 0);
  int64_t const wave   = int64_t(sms) * per_sm;
  int64_t const blocks = tiles < wave ? tiles : wave;
  if (blocks > INT32_MAX) return cudaErrorInvalidValue;  // gridDim.x holds at most 2^31 - 1
  dim3 const grid{unsigned(blocks)};
  dim3 const block{unsigned(kThreads)};
  kernel<<<grid, block, 0, stream>>>(x, y, n, op);
  return cudaGetLastError();
}
"""

kernel = CuteKernel(CUDA_SRC, {"hardtanh_persistent": ("f32*", "f32*", "i64", "f32", "f32")}, name="hardtanh_persistent")


class ModelNew(nn.Module):
    def __init__(self):
        super().__init__()
        self.min_val = -1.0  # the bounds the task's forward passes to F.hardtanh
        self.max_val = 1.0

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x.contiguous()  # the kernel walks x as one flat array (a no-op for the task's inputs)
        y = torch.empty_like(x)
        kernel.hardtanh_persistent(x, y, x.numel(), self.min_val, self.max_val)
        return y
