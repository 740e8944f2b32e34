"""Hand-written honest candidate for the evaluator's throughput benchmark (not a model's output).

Task 40 (LayerNorm): y = nn.LayerNorm(normalized_shape)(x) with normalized_shape = (64, 256, 256)
and x of shape (16, 64, 256, 256): 16 rows of 4194304 floats each, normalised with the module's
own weight and bias (kept as self.ln, so the parameters are those of the reference).

Only 16 rows: each row must be spread over many CTAs. Sample 1 -- three kernels, statistics in
double precision:
* layer_norm_chunk_sums: one CTA of 512 threads per (row, chunk of 8192 floats); each thread
  loads its 4 x 128-bit vectors at once and accumulates sum(x) and sum(x^2) in double; the CTA
  combines them (double warp shuffles, then one pair per warp through shared memory) and writes the
  pair to a double workspace. In double, var = E[x^2] - E[x]^2 loses nothing that matters (the
  cancellation would cost fp32 digits, not double ones).
* layer_norm_finalize: one CTA per row adds the row's chunk pairs in a fixed order, then writes
  mean and rstd = 1/sqrt(var + eps) (biased variance, as PyTorch) as two floats.
* layer_norm_apply: an elementwise kernel with grid (row tiles, rows): each thread moves 4
  128-bit vectors of x, weight and bias and writes (x - mean) * rstd * weight + bias.
Rows whose length is not a multiple of 4, or unaligned tensors, take scalar instances of kernels
1 and 3. Cost: x read twice, y written once, weight and bias read once per row.

How it differs from the other samples: sample 0 uses two kernels with fp32 (mean, M2) per chunk held
in registers and Chan's merge; sample 2 runs a per-thread Welford recurrence over a grid-stride
loop and applies in reverse order for L2 reuse.
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
namespace layer_norm_double_impl {

using namespace cute;

constexpr int kSumThreads   = 512;                   // kernel 1
constexpr int kSumWarps     = kSumThreads / 32;
constexpr int kPer          = 16;                    // kernel 1: floats per thread (registers: 2 CTAs per SM)
constexpr int kChunk        = kSumThreads * kPer;    // kernel 1: row elements per CTA
constexpr int kFinThreads   = 256;                   // kernel 2
constexpr int kFinWarps     = kFinThreads / 32;
constexpr int kApplyThreads = 256;                   // kernel 3
constexpr int kApplyIters   = 4;                     // kernel 3: vectors per thread
constexpr int kMaxGridY     = 65535;
static_assert(kChunk == 8192, "the Python side sizes the workspace with CHUNK = 8192");
static_assert(kSumWarps <= 32 && kFinWarps <= 32, "one warp can combine all warps");

// Sum of a double over a CTA of kWarps warps, returned to every thread; `smem` holds kWarps + 1.
template <int kWarps>
__device__ __forceinline__ double cta_sum(double v, double* smem) {
  CUTE_UNROLL
  for (int offset = 16; offset > 0; offset /= 2) v += __shfl_xor_sync(0xffffffffu, v, offset);
  int const warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  if (lane == 0) smem[warp] = v;
  __syncthreads();
  if (warp == 0) {
    v = lane < kWarps ? smem[lane] : 0.0;
    CUTE_UNROLL
    for (int offset = 16; offset > 0; offset /= 2) v += __shfl_xor_sync(0xffffffffu, v, offset);
    if (lane == 0) smem[kWarps] = v;
  }
  __syncthreads();
  double const total = smem[kWarps];
  __syncthreads();
  return total;
}

// Kernel 1: (sum, sum of squares) of chunk blockIdx.x % chunks of row blockIdx.x / chunks.
template <int kVec>
__global__ void __launch_bounds__(kSumThreads, 2)  // <= 64 registers: two CTAs (1024 threads) per SM
layer_norm_chunk_sums(float const* __restrict__ x, double* __restrict__ sums, int64_t cols, int64_t chunks) {
  constexpr int kIters = kPer / kVec;
  __shared__ double smem[kSumWarps + 1];
  int64_t const row = blockIdx.x / chunks, start = (blockIdx.x % chunks) * kChunk;
  int const count = int(min(int64_t(kChunk), cols - start));  // kVec divides count

  // int64 offsets: rows * cols exceeds 2^31 elements.
  Tensor gX   = make_tensor(make_gmem_ptr(x + row * cols + start), make_shape(Int<kChunk>{}));  // (CHUNK)
  auto tv     = make_layout(make_shape(Int<kVec>{}, Int<kSumThreads>{}, Int<kIters>{}));        // (VEC,THR,ITER)
  Tensor tXgX = composition(gX, tv)(_, threadIdx.x, _);                                       // (VEC,ITER)
  Tensor tXrX = make_tensor_like(tXgX);                                                       // (VEC,ITER) registers
  using VecCopy = Copy_Atom<UniversalCopy<conditional_t<kVec == 4, uint128_t, uint32_t>>, float>;
  CUTE_UNROLL
  for (int it = 0; it < kIters; ++it) {  // all loads in flight; vectors past the chunk are zeros
    if ((int(threadIdx.x) + it * kSumThreads) * kVec < count) copy(VecCopy{}, tXgX(_, it), tXrX(_, it));
    else fill(tXrX(_, it), 0.0f);
  }
  double s = 0.0, sq = 0.0;
  CUTE_UNROLL
  for (int i = 0; i < size(tXrX); ++i) {
    double const v = tXrX(i);
    s += v;
    sq += v * v;  // exact: a float squared fits a double's mantissa
  }
  s = cta_sum<kSumWarps>(s, smem);
  sq = cta_sum<kSumWarps>(sq, smem);
  if (threadIdx.x == 0) {
    sums[2 * int64_t(blockIdx.x)]     = s;
    sums[2 * int64_t(blockIdx.x) + 1] = sq;
  }
}

// Kernel 2: mean and rstd of row blockIdx.x from its chunk sums.
__global__ void __launch_bounds__(kFinThreads)
layer_norm_finalize(double const* __restrict__ sums, float* __restrict__ row_stats, int64_t cols, int64_t chunks,
                    float eps) {
  __shared__ double smem[kFinWarps + 1];
  Tensor gS = make_tensor(make_gmem_ptr(sums + 2 * int64_t(blockIdx.x) * chunks), make_layout(make_shape(Int<2>{}, chunks)));  // (2,CHUNKS)
  double s = 0.0, sq = 0.0;
  for (int64_t c = threadIdx.x; c < chunks; c += kFinThreads) {
    s += gS(0, c);
    sq += gS(1, c);
  }
  s = cta_sum<kFinWarps>(s, smem);
  sq = cta_sum<kFinWarps>(sq, smem);
  if (threadIdx.x == 0) {
    double const mean = s / double(cols);
    double const var = fmax(sq / double(cols) - mean * mean, 0.0);  // biased, as PyTorch
    row_stats[2 * int64_t(blockIdx.x)]     = float(mean);
    row_stats[2 * int64_t(blockIdx.x) + 1] = float(1.0 / sqrt(var + double(eps)));
  }
}

// Kernel 3: y = (x - mean) * rstd * w + b over rows blockIdx.y, blockIdx.y + gridDim.y, ...
template <int kVec>
__global__ void __launch_bounds__(kApplyThreads)
layer_norm_apply(float const* __restrict__ x, float const* __restrict__ w, float const* __restrict__ b,
                 float const* __restrict__ row_stats, float* __restrict__ y, int64_t rows, int64_t cols) {
  using VecCopy = Copy_Atom<UniversalCopy<conditional_t<kVec == 4, uint128_t, uint32_t>>, float>;
  int64_t const nvec = cols / kVec;
  int64_t const first = int64_t(blockIdx.x) * kApplyThreads * kApplyIters + threadIdx.x;
  auto row_vecs = make_layout(make_shape(Int<kVec>{}, nvec));  // (VEC,NVEC):(_1,VEC)
  Tensor gW = make_tensor(make_gmem_ptr(w), row_vecs);         // (VEC,NVEC)
  Tensor gB = make_tensor(make_gmem_ptr(b), row_vecs);         // (VEC,NVEC)
  for (int64_t row = blockIdx.y; row < rows; row += gridDim.y) {
    Tensor gX = make_tensor(make_gmem_ptr(x + row * cols), row_vecs);             // (VEC,NVEC)
    Tensor gY = make_tensor(make_gmem_ptr(y + row * cols), row_vecs);             // (VEC,NVEC)
    Tensor rX = make_tensor<float>(Shape<Int<kVec>, Int<kApplyIters>>{});        // (VEC,ITER) registers
    CUTE_UNROLL
    for (int it = 0; it < kApplyIters; ++it) {  // x loads first
      int64_t const v = first + it * kApplyThreads;
      if (v < nvec) copy(VecCopy{}, gX(_, v), rX(_, it));
    }
    float const mean = row_stats[2 * row], rstd = row_stats[2 * row + 1];
    CUTE_UNROLL
    for (int it = 0; it < kApplyIters; ++it) {
      int64_t const v = first + it * kApplyThreads;
      if (v < nvec) {
        Tensor rW = make_tensor<float>(Shape<Int<kVec>>{});  // (VEC) registers
        Tensor rB = make_tensor<float>(Shape<Int<kVec>>{});  // (VEC) registers
        copy(VecCopy{}, gW(_, v), rW);
        copy(VecCopy{}, gB(_, v), rB);
        CUTE_UNROLL
        for (int j = 0; j < kVec; ++j) rX(j, it) = (rX(j, it) - mean) * rstd * rW(j) + rB(j);
        copy(VecCopy{}, rX(_, it), gY(_, v));
      }
    }
  }
}

template <int kVec>
int launch(float const* x, float const* w, float const* b, double* sums, float* row_stats, float* y, int64_t rows,
           int64_t cols, int64_t chunks, float eps, cudaStream_t stream) {
  int64_t const apply_ctas = (cols / kVec + kApplyThreads * kApplyIters - 1) / (kApplyThreads * kApplyIters);
  if (apply_ctas > INT32_MAX) return cudaErrorInvalidValue;
  layer_norm_chunk_sums<kVec><<<unsigned(rows * chunks), kSumThreads, 0, stream>>>(x, sums, cols, chunks);
  layer_norm_finalize<<<unsigned(rows), kFinThreads, 0, stream>>>(sums, row_stats, cols, chunks, eps);
  dim3 const grid{unsigned(apply_ctas), unsigned(min(rows, int64_t(kMaxGridY)))};  // braces: not a function declaration
  layer_norm_apply<kVec><<<grid, kApplyThreads, 0, stream>>>(x, w, b, row_stats, y, rows, cols);
  return cudaGetLastError();
}

}  // namespace layer_norm_double_impl

// x, y: (rows, cols) contiguous; w, b: (cols); sums: >= 2 * rows * ceil(cols / 8192) doubles;
// row_stats: >= 2 * rows floats.
extern "C" int layer_norm(float const* x, float const* w, float const* b, double* sums, float* row_stats, float* y,
                          int64_t rows, int64_t cols, float eps, cudaStream_t stream) {
  using namespace layer_norm_double_impl;
  if (rows == 0 || cols == 0) return cudaSuccess;  // nothing to normalise; an empty grid is a launch error
  int64_t const chunks = (cols + kChunk - 1) / kChunk;
  if (rows > INT32_MAX / chunks) return cudaErrorInvalidValue;  // grid.x of kernel 1
  bool aligned = cols % 4 == 0;
  for (void const* p : {static_cast<void const*>(x), static_cast<void const*>(w), static_cast<void const*>(b),
                        static_cast<void const*>(y)}) {
    aligned = aligned && reinterpret_cast<uintptr_t>(p) % 16 == 0;
  }
  return aligned ? launch<4>(x, w, b, sums, row_stats, y, rows, cols, chunks, eps, stream)
                 : launch<1>(x, w, b, sums, row_stats, y, rows, cols, chunks, eps, stream);
}
"""

kernel = CuteKernel(
    CUDA_SRC,
    {"layer_norm": ("f32*", "f32*", "f32*", "f64*", "f32*", "f32*", "i64", "i64", "f32")},
    name="layer_norm_double",
)

CHUNK = 8192  # kChunk in the source: the workspace holds (sum, sum of squares) per row chunk


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
        chunks = (cols + CHUNK - 1) // CHUNK
        sums = torch.empty(max(1, 2 * rows * chunks), dtype=torch.float64, device=x.device)
        row_stats = torch.empty(max(1, 2 * rows), dtype=torch.float32, device=x.device)
        y = torch.empty_like(x)
        kernel.layer_norm(x, self.ln.weight.contiguous(), self.ln.bias.contiguous(), sums, row_stats, y, rows, cols,
                          float(self.ln.eps))
        return y
