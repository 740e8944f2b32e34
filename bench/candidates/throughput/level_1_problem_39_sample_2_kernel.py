"""Hand-written honest candidate for the evaluator's throughput benchmark (not a model's output).

Task 39 (L2Norm): y = x / norm(x, p=2, dim=1, keepdim=True) for x of shape (rows, cols) = (32768, 65535).

Sample 2 -- two kernels: a reduction that writes one divisor per row to a workspace, then a flat
elementwise division that does not care where rows start.
* norm_row_divisor: one warp per row (8 rows per CTA of 256 threads, no shared memory, no CTA
  barrier): each lane sums the sum of x^2 over its columns lane, lane + 32, ... with kUnroll
  scalar loads in flight (every warp load is one 128-byte run), the warp combines with shuffles,
  and lane 0 writes d = norm = sqrt(sum).
* norm_divide_flat: the tensor as one flat array of 128-bit vectors (the base pointers are 16-byte
  aligned even though the rows of 65535 floats are not), kIters vectors in flight per thread. A
  vector's row comes from a multiply by 1/cols in double plus a +-1 correction (no 64-bit integer
  division); since cols >= 4 a vector spans at most two rows, so it reads at most two divisors
  (cached: the divisor array is 128 KB). y = x / d, a true division as in PyTorch. Unaligned bases
  or rows shorter than 4 take a scalar variant of the same kernel.
Cost: x read twice (the second time from DRAM: kernel 1 has streamed all of x before kernel 2
starts), y written once, 4 bytes per row of workspace.

How it differs from the other samples: sample 0 is one fused kernel (a CTA per row, two sweeps with
peeled vectors); sample 1 holds each row in the distributed shared memory of a CTA cluster and
reads x once.
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
namespace l2_norm_twokernel_impl {

using namespace cute;

constexpr int kRowThreads   = 256;                 // kernel 1: 8 warps, one row each
constexpr int kRowsPerCta   = kRowThreads / 32;
constexpr int kUnroll       = 8;                   // kernel 1: loads in flight per lane
constexpr int kFlatThreads  = 256;                 // kernel 2
constexpr int kVec          = 4;                   // floats per 128-bit access
constexpr int kIters        = 4;                   // kernel 2: vectors in flight per thread
constexpr int kFlatTile     = kFlatThreads * kIters;  // vectors per CTA
static_assert(sizeof(float) * kVec == 16, "a vector must be exactly one 128-bit access");
static_assert(kRowThreads % 32 == 0, "whole warps: a warp is a row");

// The per-element term of the reduction: sum of x^2.
__device__ __forceinline__ float term(float v) { return v * v; }

// Kernel 1: d[row] for rows blockIdx.x * 8 + warp.
__global__ void __launch_bounds__(kRowThreads)
norm_row_divisor(float const* __restrict__ x, float* __restrict__ d, int64_t rows, int64_t cols) {
  int const lane = threadIdx.x % 32;
  int64_t const row = int64_t(blockIdx.x) * kRowsPerCta + threadIdx.x / 32;
  if (row >= rows) return;  // whole warps leave: no barrier follows
  // int64 offsets: rows * cols exceeds 2^31 elements.
  Tensor gX = make_tensor(make_gmem_ptr(x + row * cols), make_shape(cols));  // (COLS)
  // kUnroll independent partial sums: short dependency chains, and each sums only cols / 256 terms.
  float part[kUnroll];
  CUTE_UNROLL
  for (int u = 0; u < kUnroll; ++u) part[u] = 0.0f;
  for (int64_t base = 0; base < cols; base += 32 * kUnroll) {
    float v[kUnroll];
    CUTE_UNROLL
    for (int u = 0; u < kUnroll; ++u) {  // all loads first, then the adds
      int64_t const i = base + u * 32 + lane;
      v[u] = i < cols ? term(gX(i)) : 0.0f;
    }
    CUTE_UNROLL
    for (int u = 0; u < kUnroll; ++u) part[u] += v[u];
  }
  float acc = 0.0f;
  CUTE_UNROLL
  for (int u = 0; u < kUnroll; ++u) acc += part[u];
  CUTE_UNROLL
  for (int offset = 16; offset > 0; offset /= 2) acc += __shfl_xor_sync(0xffffffffu, acc, offset);
  float const sum = acc;
  if (lane == 0) d[row] = sqrtf(sum);  // a zero row gives 0/0 = NaN, as in torch
}

// The row of flat element e: e / cols without a 64-bit integer division. double(e) is exact and
// e * (1/cols) is within one of the true quotient for any e < 2^52, so one correction suffices.
__device__ __forceinline__ int64_t row_of(int64_t e, int64_t cols, double inv_cols) {
  int64_t r = int64_t(double(e) * inv_cols);
  if (r * cols > e) --r;
  else if ((r + 1) * cols <= e) ++r;
  return r;
}

// Kernel 2, vector path: x and y 16-byte aligned, cols >= 4.
__global__ void __launch_bounds__(kFlatThreads)
norm_divide_flat(float const* __restrict__ x, float const* __restrict__ d, float* __restrict__ y,
                 int64_t total, int64_t cols, double inv_cols) {
  int64_t const nvec = total / kVec;
  Tensor gXv = make_tensor(make_gmem_ptr(x), make_layout(make_shape(Int<kVec>{}, nvec)));   // (VEC,NVEC)
  Tensor gYv = make_tensor(make_gmem_ptr(y), make_layout(make_shape(Int<kVec>{}, nvec)));   // (VEC,NVEC)
  Tensor gX  = make_tensor(make_gmem_ptr(x), make_shape(total));                             // (TOTAL)
  Tensor gY  = make_tensor(make_gmem_ptr(y), make_shape(total));                             // (TOTAL)
  using VecCopy = Copy_Atom<UniversalCopy<uint128_t>, float>;

  Tensor rX = make_tensor<float>(Shape<Int<kVec>, Int<kIters>>{});  // (VEC,ITER) registers
  int64_t const first = int64_t(blockIdx.x) * kFlatTile + threadIdx.x;
  CUTE_UNROLL
  for (int it = 0; it < kIters; ++it) {  // all loads first
    int64_t const v = first + it * kFlatThreads;
    if (v < nvec) copy(VecCopy{}, gXv(_, v), rX(_, it));
  }
  CUTE_UNROLL
  for (int it = 0; it < kIters; ++it) {
    int64_t const v = first + it * kFlatThreads;
    if (v < nvec) {
      int64_t const e0 = v * kVec;
      int64_t const r0 = row_of(e0, cols, inv_cols);
      int64_t const next = (r0 + 1) * cols;  // first element of the next row
      float const d0 = d[r0];
      float const d1 = (e0 + kVec - 1 >= next) ? d[r0 + 1] : d0;  // cols >= 4: at most two rows
      CUTE_UNROLL
      for (int e = 0; e < kVec; ++e) rX(e, it) = rX(e, it) / (e0 + e >= next ? d1 : d0);
      copy(VecCopy{}, rX(_, it), gYv(_, v));
    }
  }
  // The < 4 floats past the last whole vector.
  if (blockIdx.x == 0 && threadIdx.x < total - nvec * kVec) {
    int64_t const e = nvec * kVec + threadIdx.x;
    gY(e) = gX(e) / d[row_of(e, cols, inv_cols)];
  }
}

// Kernel 2, scalar path: any alignment and row length.
__global__ void __launch_bounds__(kFlatThreads)
norm_divide_flat_scalar(float const* __restrict__ x, float const* __restrict__ d, float* __restrict__ y,
                        int64_t total, int64_t cols, double inv_cols) {
  Tensor gX = make_tensor(make_gmem_ptr(x), make_shape(total));  // (TOTAL)
  Tensor gY = make_tensor(make_gmem_ptr(y), make_shape(total));  // (TOTAL)
  int64_t const first = int64_t(blockIdx.x) * kFlatThreads * kVec + threadIdx.x;
  CUTE_UNROLL
  for (int k = 0; k < kVec; ++k) {
    int64_t const e = first + k * kFlatThreads;
    if (e < total) gY(e) = gX(e) / d[row_of(e, cols, inv_cols)];
  }
}

}  // namespace l2_norm_twokernel_impl

// x, y: (rows, cols) contiguous; d: at least rows floats of workspace; y = x / norm(x) per row.
extern "C" int l2_norm_rows(float const* x, float* d, float* y, int64_t rows, int64_t cols, cudaStream_t stream) {
  using namespace l2_norm_twokernel_impl;
  if (rows == 0 || cols == 0) return cudaSuccess;  // nothing to do; an empty grid is a launch error
  int64_t const total = rows * cols;
  int64_t const row_ctas = (rows + kRowsPerCta - 1) / kRowsPerCta;
  if (row_ctas > INT32_MAX || total >= (int64_t(1) << 52)) return cudaErrorInvalidValue;
  double const inv_cols = 1.0 / double(cols);
  norm_row_divisor<<<unsigned(row_ctas), kRowThreads, 0, stream>>>(x, d, rows, cols);
  bool const aligned = reinterpret_cast<uintptr_t>(x) % 16 == 0 && reinterpret_cast<uintptr_t>(y) % 16 == 0;
  if (aligned && cols >= kVec) {
    int64_t const ctas = (total / kVec + kFlatTile - 1) / kFlatTile;
    // cols >= 4, so total >= 4 and ctas >= 1: CTA 0 exists to write the < 4 tail floats.
    if (ctas > INT32_MAX) return cudaErrorInvalidValue;
    norm_divide_flat<<<unsigned(ctas), kFlatThreads, 0, stream>>>(x, d, y, total, cols, inv_cols);
  } else {
    int64_t const ctas = (total + kFlatThreads * kVec - 1) / (kFlatThreads * kVec);
    if (ctas > INT32_MAX) return cudaErrorInvalidValue;
    norm_divide_flat_scalar<<<unsigned(ctas), kFlatThreads, 0, stream>>>(x, d, y, total, cols, inv_cols);
  }
  return cudaGetLastError();
}
"""

kernel = CuteKernel(CUDA_SRC, {"l2_norm_rows": ("f32*", "f32*", "f32*", "i64", "i64")}, name="l2_norm_twokernel")


class ModelNew(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.dim() != 2:
            raise NotImplementedError("this kernel normalises over dim 1 of a 2-D tensor (the task's shape)")
        x = x.contiguous()
        rows, cols = x.shape[0], x.shape[1]
        divisors = torch.empty(max(1, rows), dtype=torch.float32, device=x.device)
        y = torch.empty_like(x)
        kernel.l2_norm_rows(x, divisors, y, rows, cols)
        return y
