"""Hand-written honest candidate for the evaluator's throughput benchmark (not a model's output).

Task 40 (LayerNorm): y = nn.LayerNorm(normalized_shape)(x) with normalized_shape = (64, 256, 256)
and x of shape (16, 64, 256, 256): 16 rows of 4194304 floats each, normalised with the module's
own weight and bias (kept as self.ln, so the parameters are those of the reference).

Only 16 rows: each row must be spread over many CTAs. Sample 2 -- a persistent, grid-stride pair
of kernels sized to one full wave of the GPU (G CTAs per row, G from the SM count and the
occupancy of kernel 1, so every CTA is resident at once):
* layer_norm_welford: CTA g of a row takes the row's 128-bit vectors g*256 + t, then every
  G*256-th one (a step of the grid covers one contiguous stretch of every row), 4 vectors in
  flight per thread. Each thread keeps a running (count, mean, M2): a vector's own mean and M2 are
  folded in with Chan's formula, so no sum of squares ever cancels. The CTA merges its threads'
  triples (warp butterflies, then warp 0 over the warps) and writes one triple per CTA.
* layer_norm_apply_reversed: the same grid; the first warp of each CTA merges the row's G triples
  in a fixed order (every CTA of the row gets the same bits), then the CTA writes
  (x - mean) * rstd * weight + bias walking its vectors in REVERSE: kernel 1's last steps are what
  L2 still holds, so they are re-read first, before later reads evict them.
Rows whose length is not a multiple of 4, or unaligned tensors, take scalar instances.
Cost: x read twice (the second read partly from L2), y written once, weight and bias once per row.

How it differs from the other samples: sample 0 holds 8192-float chunks in registers (exact
two-pass per chunk, one CTA per chunk); sample 1 accumulates (sum, sum of squares) in double with
a separate finalise kernel and a flat apply kernel.
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
namespace layer_norm_welford_impl {

using namespace cute;

constexpr int kThreads  = 256;
constexpr int kWarps    = kThreads / 32;
constexpr int kUnroll   = 4;      // vectors in flight per thread
constexpr int kMaxGroup = 1024;   // CTAs per row at most
static_assert(kThreads % 32 == 0 && kWarps <= 32, "whole warps, and one warp can combine all warps");

// Running statistics: count, mean, sum of squared deviations from the mean.
struct Welford {
  float n;
  float mean;
  float m2;
};

// Chan et al.: merge b into a. An empty side leaves the other as is.
__device__ __forceinline__ Welford merge(Welford a, Welford b) {
  float const n = a.n + b.n;
  if (n == 0.0f) return a;
  float const delta = b.mean - a.mean;
  float const wb = b.n / n;
  return {n, a.mean + delta * wb, a.m2 + b.m2 + delta * delta * a.n * wb};
}

// The (count, mean, M2) of one vector of values.
template <class Values>
__device__ __forceinline__ Welford of_vector(Values const& v) {
  float s = 0.0f;
  CUTE_UNROLL
  for (int i = 0; i < size(v); ++i) s += v(i);
  float const mean = s / float(size(v));
  float m2 = 0.0f;
  CUTE_UNROLL
  for (int i = 0; i < size(v); ++i) m2 += (v(i) - mean) * (v(i) - mean);
  return {float(size(v)), mean, m2};
}

__device__ __forceinline__ Welford shfl_xor(Welford w, int offset) {
  return {__shfl_xor_sync(0xffffffffu, w.n, offset), __shfl_xor_sync(0xffffffffu, w.mean, offset),
          __shfl_xor_sync(0xffffffffu, w.m2, offset)};
}

// Thread t of CTA g handles vectors g*T + t + k*G*T of its row, k = 0 .. count - 1.
__device__ __forceinline__ int64_t vectors_of_thread(int64_t first, int64_t stride, int64_t nvec) {
  return first < nvec ? (nvec - first + stride - 1) / stride : 0;
}

// Kernel 1: the Welford triple of CTA g = blockIdx.x % G of row blockIdx.x / G.
template <int kVec>
__global__ void __launch_bounds__(kThreads)
layer_norm_welford(float const* __restrict__ x, float* __restrict__ partials, int64_t cols, int64_t group) {
  __shared__ Welford smem[kWarps];
  using VecCopy = Copy_Atom<UniversalCopy<conditional_t<kVec == 4, uint128_t, uint32_t>>, float>;
  int64_t const row = blockIdx.x / group, g = blockIdx.x % group;
  int64_t const nvec = cols / kVec;
  int64_t const first = g * kThreads + threadIdx.x, stride = group * kThreads;
  int64_t const count = vectors_of_thread(first, stride, nvec);
  // int64 offsets: rows * cols exceeds 2^31 elements.
  Tensor gX = make_tensor(make_gmem_ptr(x + row * cols), make_layout(make_shape(Int<kVec>{}, nvec)));  // (VEC,NVEC)

  Welford acc{0.0f, 0.0f, 0.0f};
  for (int64_t k0 = 0; k0 < count; k0 += kUnroll) {
    Tensor rX = make_tensor<float>(Shape<Int<kVec>, Int<kUnroll>>{});  // (VEC,UNROLL) registers
    CUTE_UNROLL
    for (int u = 0; u < kUnroll; ++u) {  // all loads first
      if (k0 + u < count) copy(VecCopy{}, gX(_, first + (k0 + u) * stride), rX(_, u));
    }
    CUTE_UNROLL
    for (int u = 0; u < kUnroll; ++u) {
      if (k0 + u < count) acc = merge(acc, of_vector(rX(_, u)));
    }
  }
  CUTE_UNROLL
  for (int offset = 16; offset > 0; offset /= 2) acc = merge(acc, shfl_xor(acc, offset));
  int const warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  if (lane == 0) smem[warp] = acc;
  __syncthreads();
  if (warp == 0) {
    acc = lane < kWarps ? smem[lane] : Welford{0.0f, 0.0f, 0.0f};
    CUTE_UNROLL
    for (int offset = 16; offset > 0; offset /= 2) acc = merge(acc, shfl_xor(acc, offset));
    if (lane == 0) {
      partials[3 * int64_t(blockIdx.x)]     = acc.n;
      partials[3 * int64_t(blockIdx.x) + 1] = acc.mean;
      partials[3 * int64_t(blockIdx.x) + 2] = acc.m2;
    }
  }
}

// Kernel 2: merge the row's G triples, then normalise this CTA's vectors, last step first.
template <int kVec>
__global__ void __launch_bounds__(kThreads)
layer_norm_apply_reversed(float const* __restrict__ x, float const* __restrict__ w, float const* __restrict__ b,
                          float const* __restrict__ partials, float* __restrict__ y, int64_t cols, int64_t group,
                          float eps) {
  __shared__ float row_stats[2];
  using VecCopy = Copy_Atom<UniversalCopy<conditional_t<kVec == 4, uint128_t, uint32_t>>, float>;
  int64_t const row = blockIdx.x / group, g = blockIdx.x % group;
  int64_t const nvec = cols / kVec;
  int64_t const first = g * kThreads + threadIdx.x, stride = group * kThreads;
  int64_t const count = vectors_of_thread(first, stride, nvec);
  auto row_vecs = make_layout(make_shape(Int<kVec>{}, nvec));                        // (VEC,NVEC):(_1,VEC)
  Tensor gX = make_tensor(make_gmem_ptr(x + row * cols), row_vecs);                  // (VEC,NVEC)
  Tensor gY = make_tensor(make_gmem_ptr(y + row * cols), row_vecs);                  // (VEC,NVEC)
  Tensor gW = make_tensor(make_gmem_ptr(w), row_vecs);                               // (VEC,NVEC)
  Tensor gB = make_tensor(make_gmem_ptr(b), row_vecs);                               // (VEC,NVEC)

  if (threadIdx.x < 32) {
    // Lane l merges triples l, l + 32, ... in order, then a fixed butterfly: same bits in every CTA.
    Tensor gP = make_tensor(make_gmem_ptr(partials + 3 * row * group), make_layout(make_shape(Int<3>{}, group)));  // (3,G)
    Welford acc{0.0f, 0.0f, 0.0f};
    for (int64_t c = threadIdx.x; c < group; c += 32) acc = merge(acc, Welford{gP(0, c), gP(1, c), gP(2, c)});
    CUTE_UNROLL
    for (int offset = 16; offset > 0; offset /= 2) acc = merge(acc, shfl_xor(acc, offset));
    if (threadIdx.x == 0) {
      row_stats[0] = acc.mean;
      row_stats[1] = rsqrtf(acc.m2 / float(cols) + eps);  // biased variance, as PyTorch
    }
  }
  __syncthreads();
  float const mean = row_stats[0], rstd = row_stats[1];

  for (int64_t k0 = count - 1; k0 >= 0; k0 -= kUnroll) {
    Tensor rX = make_tensor<float>(Shape<Int<kVec>, Int<kUnroll>>{});  // (VEC,UNROLL) registers
    CUTE_UNROLL
    for (int u = 0; u < kUnroll; ++u) {  // x loads first
      if (k0 - u >= 0) copy(VecCopy{}, gX(_, first + (k0 - u) * stride), rX(_, u));
    }
    CUTE_UNROLL
    for (int u = 0; u < kUnroll; ++u) {
      if (k0 - u >= 0) {
        int64_t const v = first + (k0 - u) * stride;
        Tensor rW = make_tensor<float>(Shape<Int<kVec>>{});  // (VEC) registers
        Tensor rB = make_tensor<float>(Shape<Int<kVec>>{});  // (VEC) registers
        copy(VecCopy{}, gW(_, v), rW);
        copy(VecCopy{}, gB(_, v), rB);
        CUTE_UNROLL
        for (int j = 0; j < kVec; ++j) rX(j, u) = (rX(j, u) - mean) * rstd * rW(j) + rB(j);
        copy(VecCopy{}, rX(_, u), gY(_, v));
      }
    }
  }
}

template <int kVec>
int launch(float const* x, float const* w, float const* b, float* partials, int64_t slots, float* y, int64_t rows,
           int64_t cols, float eps, cudaStream_t stream) {
  // One full wave: G CTAs per row so that rows * G CTAs are all resident at once.
  int device = 0, sms = 0, per_sm = 0;
  cudaError_t err = cudaGetDevice(&device);
  if (err == cudaSuccess) err = cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device);
  if (err == cudaSuccess) err = cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, layer_norm_welford<kVec>, kThreads, 0);
  if (err != cudaSuccess) return err;
  int64_t const nvec = cols / kVec;
  int64_t group = max(int64_t(1), int64_t(sms) * max(per_sm, 1) / rows);
  group = min(group, (nvec + kThreads - 1) / kThreads);  // no CTA without a vector
  group = min(group, min(int64_t(kMaxGroup), slots / rows));  // the workspace holds `slots` triples
  group = max(int64_t(1), group);
  if (rows > INT32_MAX / group) return cudaErrorInvalidValue;  // grid.x = rows * G
  unsigned const grid = unsigned(rows * group);
  layer_norm_welford<kVec><<<grid, kThreads, 0, stream>>>(x, partials, cols, group);
  layer_norm_apply_reversed<kVec><<<grid, kThreads, 0, stream>>>(x, w, b, partials, y, cols, group, eps);
  return cudaGetLastError();
}

}  // namespace layer_norm_welford_impl

// x, y: (rows, cols) contiguous; w, b: (cols); partials: 3 * slots floats, slots >= rows.
extern "C" int layer_norm(float const* x, float const* w, float const* b, float* partials, int64_t slots, float* y,
                          int64_t rows, int64_t cols, float eps, cudaStream_t stream) {
  using namespace layer_norm_welford_impl;
  if (rows == 0 || cols == 0) return cudaSuccess;  // nothing to normalise; an empty grid is a launch error
  if (slots < rows) return cudaErrorInvalidValue;   // one triple per row at least
  bool aligned = cols % 4 == 0;
  for (void const* p : {static_cast<void const*>(x), static_cast<void const*>(w), static_cast<void const*>(b),
                        static_cast<void const*>(y)}) {
    aligned = aligned && reinterpret_cast<uintptr_t>(p) % 16 == 0;
  }
  return aligned ? launch<4>(x, w, b, partials, slots, y, rows, cols, eps, stream)
                 : launch<1>(x, w, b, partials, slots, y, rows, cols, eps, stream);
}
"""

kernel = CuteKernel(
    CUDA_SRC, {"layer_norm": ("f32*", "f32*", "f32*", "f32*", "i64", "f32*", "i64", "i64", "f32")}, name="layer_norm_welford"
)

MAX_GROUP = 1024  # kMaxGroup in the source: at most this many (count, mean, M2) triples per row
# One wave of CTAs never exceeds this many on any current GPU (SMs x resident CTAs per SM); the
# launcher sizes G so that rows * G fits the workspace it is given.
WAVE_SLOTS = 65536


class ModelNew(nn.Module):
    def __init__(self, normalized_shape: tuple):
        super().__init__()
        self.ln = nn.LayerNorm(normalized_shape=normalized_shape)  # same parameters as the reference

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        norm_dims = len(self.ln.normalized_shape)
        if x.dim() < norm_dims or tuple(x.shape[x.dim() - norm_dims:]) != tuple(self.ln.normalized_shape) \
                or self.ln.weight is None or self.ln.bias is None:
            raise NotImplementedError("x must end in normalized_shape, and the LayerNorm must be affine")
        x = x.contiguous()
        cols = self.ln.weight.numel()
        rows = x.numel() // cols if cols > 0 else 0
        slots = max(1, min(rows * MAX_GROUP, max(rows, WAVE_SLOTS)))
        partials = torch.empty(3 * slots, dtype=torch.float32, device=x.device)
        y = torch.empty_like(x)
        kernel.layer_norm(x, self.ln.weight.contiguous(), self.ln.bias.contiguous(), partials, slots, y, rows, cols,
                          float(self.ln.eps))
        return y
