"""Example candidate for examples/tasks/row_softmax.py: y = softmax(x, dim=-1) over the rows of x.

CuTe kernels, one CTA per row, memory-bound: the floor is one read of x and one write of y. The
launcher picks one of two paths from the row length and alignment:

* Register-resident (cols % 4 == 0, both pointers 16-byte aligned, cols <= 16384): each thread loads
  its share of the row once, as kVecs 128-bit vectors, every load issued before any is used; the CTA
  shape (kRowThreads, kVecs) is the launcher's pick for the row length, from (64, 1) for rows of up
  to 256 floats to (512, 8) for 16384, and vectors past the row end are predicated off. The row
  maximum is reduced from the registers, then exp(x - max) overwrites the registers while their sum
  is taken, then y = exp(x - max) / sum is written from the same registers. Each element crosses
  DRAM once each way, however little of the row L2 still holds when y is written.
* Streaming (longer rows, cols % 4 != 0, or a view off a 16-byte boundary), 256 threads: any row
  length works, no part of the row has to fit in registers. A first sweep finds max and sum in one
  read with the online softmax recurrence: each thread keeps a running maximum m and a running sum
  s of exp(x - m), and when m grows the sum is rescaled by exp(m_old - m_new). A second sweep
  re-reads the row to write exp(x - m) / s; those re-reads hit L2 only while the rows of all
  resident CTAs fit there, so at long rows DRAM sees part of the row twice. Full steps use 128-bit
  vectors, several in flight per thread as in swish_scale_cute.py; the residue step of a row and
  unaligned rows take a predicated scalar path.

Both paths reduce across the CTA the same way (warp shuffles, then one value per warp through shared
memory) and use the max-subtracted form, so huge inputs do not overflow. A row that is all -inf gives
NaN, as torch.softmax does.

Short rows are the weak spot of one CTA per row: an SM holds at most 32 CTAs, so with 256-float rows
only 32 KB of rows are in flight per SM; several rows per CTA would fix that. The table in
bench/results/knowledge-h200.md has the measured bandwidth of each path.
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
namespace row_softmax_impl {

using namespace cute;

constexpr int kThreads = 256;                      // streaming path: threads per CTA; one CTA per row
constexpr int kWarps   = kThreads / 32;
constexpr int kVec     = 4;                        // floats per 128-bit access
constexpr int kIters   = 4;                        // streaming path: vectors per thread per step in flight
constexpr int kStep    = kVec * kThreads * kIters; // streaming path: row elements a CTA covers per step
constexpr int kMaxRow  = 512 * kVec * 8;           // register path: longest row (512 threads x 8 vectors)

static_assert(sizeof(float) * kVec == 16, "a vector must be exactly one 128-bit access");
static_assert(kThreads % 32 == 0 && kWarps <= 32, "whole warps, and one warp can combine all warps");

// Running maximum m and sum s of exp(x - m) over the elements seen so far; {-inf, 0} is "none".
struct MaxSum {
  float m;
  float s;
};

// Merge two partial results: the smaller maximum's sum is rescaled to the larger maximum.
__device__ __forceinline__ MaxSum combine(MaxSum a, MaxSum b) {
  float m = fmaxf(a.m, b.m);
  if (m == -INFINITY) return {m, 0.0f};  // both empty: -inf - -inf would be NaN
  return {m, a.s * expf(a.m - m) + b.s * expf(b.m - m)};
}

// Fold a vector of values into a running result: one rescale per vector, not per element.
template <class Values>
__device__ __forceinline__ MaxSum fold(MaxSum acc, Values const& v) {
  float vmax = v(0);
  CUTE_UNROLL
  for (int i = 1; i < size(v); ++i) vmax = fmaxf(vmax, v(i));
  float m = fmaxf(acc.m, vmax);
  if (m == -INFINITY) return acc;  // every value so far is -inf: nothing to add
  float s = acc.s * expf(acc.m - m);
  CUTE_UNROLL
  for (int i = 0; i < size(v); ++i) s += expf(v(i) - m);
  return {m, s};
}

// The (m, s) of the whole CTA, returned to every thread.
__device__ __forceinline__ MaxSum cta_reduce(MaxSum acc, MaxSum* smem) {
  CUTE_UNROLL
  for (int offset = 16; offset > 0; offset /= 2) {
    MaxSum other{__shfl_xor_sync(0xffffffffu, acc.m, offset), __shfl_xor_sync(0xffffffffu, acc.s, offset)};
    acc = combine(acc, other);
  }
  int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  if (lane == 0) smem[warp] = acc;
  __syncthreads();
  if (warp == 0) {
    acc = lane < kWarps ? smem[lane] : MaxSum{-INFINITY, 0.0f};
    CUTE_UNROLL
    for (int offset = 16; offset > 0; offset /= 2) {
      MaxSum other{__shfl_xor_sync(0xffffffffu, acc.m, offset), __shfl_xor_sync(0xffffffffu, acc.s, offset)};
      acc = combine(acc, other);
    }
    if (lane == 0) smem[kWarps] = acc;
  }
  __syncthreads();
  return smem[kWarps];
}

// op(v) over a CTA of kCtaWarps warps, returned to every thread: the register path's float
// reductions, whose CTAs come in several sizes. `empty` is op's identity: it stands in for the warps
// that do not exist when warp 0 combines one value per warp. `smem` holds kCtaWarps + 1 floats and
// must not be shared with another reduction: the result is read back from it after the last barrier.
template <int kCtaWarps, class Op>
__device__ __forceinline__ float cta_reduce(float v, float empty, float* smem, Op op) {
  static_assert(kCtaWarps >= 1 && kCtaWarps <= 32, "one warp combines one value per warp");
  CUTE_UNROLL
  for (int offset = 16; offset > 0; offset /= 2) v = op(v, __shfl_xor_sync(0xffffffffu, v, offset));
  int const warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  if (lane == 0) smem[warp] = v;
  __syncthreads();
  if (warp == 0) {
    v = lane < kCtaWarps ? smem[lane] : empty;
    CUTE_UNROLL
    for (int offset = 16; offset > 0; offset /= 2) v = op(v, __shfl_xor_sync(0xffffffffu, v, offset));
    if (lane == 0) smem[kCtaWarps] = v;
  }
  __syncthreads();
  return smem[kCtaWarps];
}

// Register path: the row is read from DRAM once and kept in registers from the first load to the
// last store, so y costs no second read however little of the row L2 still holds. Requires
// cols % 4 == 0 and 16-byte aligned pointers (every row then starts on a vector boundary and a
// vector is wholly inside the row or wholly past its end) and cols <= kTile.
template <int kRowThreads, int kVecs>
__global__ void __launch_bounds__(kRowThreads)
row_softmax_regs_kernel(float const* __restrict__ x, float* __restrict__ y, int cols) {
  static_assert(kRowThreads % 32 == 0, "whole warps, so each warp access is one contiguous run");
  constexpr int kRowWarps = kRowThreads / 32;
  constexpr int kTile = kVec * kRowThreads * kVecs;  // row elements the CTA holds; the tail is predicated off
  __shared__ float smem_max[kRowWarps + 1];
  __shared__ float smem_sum[kRowWarps + 1];

  // int64 row stride: rows * cols may exceed 2^31 elements.
  auto row_major = make_layout(make_shape(int(gridDim.x), cols), make_stride(int64_t(cols), Int<1>{}));
  Tensor mX = make_tensor(make_gmem_ptr(x), row_major);                                       // (ROWS,COLS)
  Tensor mY = make_tensor(make_gmem_ptr(y), row_major);                                       // (ROWS,COLS)
  Tensor gX = local_tile(mX(blockIdx.x, _), Shape<Int<kTile>>{}, make_coord(0));              // (TILE)
  Tensor gY = local_tile(mY(blockIdx.x, _), Shape<Int<kTile>>{}, make_coord(0));              // (TILE)
  Tensor cX = local_tile(make_identity_tensor(make_shape(cols)), Shape<Int<kTile>>{}, make_coord(0)); // (TILE) -> col

  // Thread t owns kVecs vectors of kVec contiguous floats, kVec * kRowThreads apart; neighbouring
  // threads own neighbouring vectors, so each warp access is one contiguous 512-byte run.
  auto tv = make_layout(make_shape(Int<kVec>{}, Int<kRowThreads>{}, Int<kVecs>{}));  // (VEC,THR,ITER):(_1,VEC,VEC*THR)
  Tensor tXgX = composition(gX, tv)(_, threadIdx.x, _);                          // (VEC,ITER)
  Tensor tXgY = composition(gY, tv)(_, threadIdx.x, _);                          // (VEC,ITER)
  Tensor tXcX = composition(cX, tv)(_, threadIdx.x, _);                          // (VEC,ITER) -> col
  Tensor tXrX = make_tensor_like(tXgX);                                          // (VEC,ITER) registers
  // One predicate per vector: cols % 4 == 0, so a vector's first column decides for all four.
  Tensor tXpX = make_tensor<bool>(make_shape(Int<kVecs>{}));                     // (ITER) registers
  CUTE_UNROLL
  for (int it = 0; it < kVecs; ++it) tXpX(it) = elem_less(tXcX(0, it), make_shape(cols));

  using VecCopy = Copy_Atom<UniversalCopy<uint128_t>, float>;
  // Every load issues before the first use below, so the whole row is in flight at once. A vector
  // past the row end holds -inf: it cannot raise the maximum.
  CUTE_UNROLL
  for (int it = 0; it < kVecs; ++it) {
    if (tXpX(it)) copy(VecCopy{}, tXgX(_, it), tXrX(_, it));
    else fill(tXrX(_, it), -INFINITY);
  }

  float thread_max = -INFINITY;
  CUTE_UNROLL
  for (int i = 0; i < size(tXrX); ++i) thread_max = fmaxf(thread_max, tXrX(i));
  float const row_max = cta_reduce<kRowWarps>(thread_max, -INFINITY, smem_max, [](float a, float b) { return fmaxf(a, b); });

  // The max is known before any exp, so each element needs one exp (not the streaming path's
  // rescaled partial sums), and the registers keep exp(x - max) for the store. A row that is all
  // -inf has row_max = -inf: exp(-inf - -inf) is NaN, which reaches every output, as in torch.
  float thread_sum = 0.0f;
  CUTE_UNROLL
  for (int it = 0; it < kVecs; ++it) {
    if (tXpX(it)) {  // a padding vector must not add exp(-inf - row_max) to the sum
      CUTE_UNROLL
      for (int v = 0; v < kVec; ++v) {
        tXrX(v, it) = expf(tXrX(v, it) - row_max);
        thread_sum += tXrX(v, it);
      }
    }
  }
  float const inv_sum = 1.0f / cta_reduce<kRowWarps>(thread_sum, 0.0f, smem_sum, [](float a, float b) { return a + b; });

  CUTE_UNROLL
  for (int it = 0; it < kVecs; ++it) {
    if (tXpX(it)) {
      CUTE_UNROLL
      for (int v = 0; v < kVec; ++v) tXrX(v, it) *= inv_sum;
      copy(VecCopy{}, tXrX(_, it), tXgY(_, it));
    }
  }
}

// Streaming path, any row length. kAligned: every row starts on a 16-byte boundary (pointers
// aligned, cols % 4 == 0), so full steps may use 128-bit accesses.
template <bool kAligned>
__global__ void __launch_bounds__(kThreads)
row_softmax_kernel(float const* __restrict__ x, float* __restrict__ y, int cols) {
  __shared__ MaxSum smem[kWarps + 1];

  // int64 row stride: rows * cols may exceed 2^31 elements.
  auto row_major = make_layout(make_shape(int(gridDim.x), cols), make_stride(int64_t(cols), Int<1>{}));
  Tensor mX = make_tensor(make_gmem_ptr(x), row_major);                          // (ROWS,COLS)
  Tensor mY = make_tensor(make_gmem_ptr(y), row_major);                          // (ROWS,COLS)
  Tensor gX = local_tile(mX(blockIdx.x, _), Shape<Int<kStep>>{}, make_coord(_)); // (STEP,NSTEP)
  Tensor gY = local_tile(mY(blockIdx.x, _), Shape<Int<kStep>>{}, make_coord(_)); // (STEP,NSTEP)
  // Logical column of every element, partitioned like the data: the residue step's predicate.
  Tensor cX = local_tile(make_identity_tensor(make_shape(cols)), Shape<Int<kStep>>{}, make_coord(_)); // (STEP,NSTEP)

  // Thread-value layout of a step: thread t owns kIters vectors of kVec contiguous floats, and
  // neighbouring threads own neighbouring vectors, so each warp access is one contiguous run.
  auto tv = make_layout(make_shape(Int<kVec>{}, Int<kThreads>{}, Int<kIters>{})); // (VEC,THR,ITER):(_1,VEC,VEC*THR)
  using VecCopy = Copy_Atom<UniversalCopy<uint128_t>, float>;
  int const steps = size<1>(gX);

  // Sweep 1: online max and sum over the row.
  MaxSum acc{-INFINITY, 0.0f};
  for (int step = 0; step < steps; ++step) {
    Tensor tXgX = composition(gX(_, step), tv)(_, threadIdx.x, _);             // (VEC,ITER)
    if (kAligned && (step + 1) * kStep <= cols) {
      Tensor tXrX = make_tensor_like(tXgX);                                     // (VEC,ITER) registers
      copy(VecCopy{}, tXgX, tXrX);  // all kIters loads issue before the math below waits on them
      CUTE_UNROLL
      for (int it = 0; it < kIters; ++it) acc = fold(acc, tXrX(_, it));
    } else {
      Tensor tXcX = composition(cX(_, step), tv)(_, threadIdx.x, _);           // (VEC,ITER)
      CUTE_UNROLL
      for (int i = 0; i < size(tXgX); ++i) {
        if (elem_less(tXcX(i), make_shape(cols))) {
          acc = combine(acc, MaxSum{tXgX(i), 1.0f});  // one element v is (m, s) = (v, exp(0))
        }
      }
    }
  }
  acc = cta_reduce(acc, smem);
  float const row_max = acc.m;
  float const inv_sum = 1.0f / acc.s;

  // Sweep 2: y = exp(x - max) / sum. The row was just read by this CTA: these loads hit in L2 as long
  // as the rows of all resident CTAs fit there.
  for (int step = 0; step < steps; ++step) {
    Tensor tXgX = composition(gX(_, step), tv)(_, threadIdx.x, _);             // (VEC,ITER)
    Tensor tXgY = composition(gY(_, step), tv)(_, threadIdx.x, _);             // (VEC,ITER)
    if (kAligned && (step + 1) * kStep <= cols) {
      Tensor tXrX = make_tensor_like(tXgX);                                     // (VEC,ITER) registers
      copy(VecCopy{}, tXgX, tXrX);
      CUTE_UNROLL
      for (int i = 0; i < size(tXrX); ++i) tXrX(i) = expf(tXrX(i) - row_max) * inv_sum;
      copy(VecCopy{}, tXrX, tXgY);
    } else {
      Tensor tXcX = composition(cX(_, step), tv)(_, threadIdx.x, _);           // (VEC,ITER)
      CUTE_UNROLL
      for (int i = 0; i < size(tXgX); ++i) {
        if (elem_less(tXcX(i), make_shape(cols))) {
          tXgY(i) = expf(tXgX(i) - row_max) * inv_sum;
        }
      }
    }
  }
}

template <int kRowThreads, int kVecs>
constexpr int regs_tile = kVec * kRowThreads * kVecs;  // the longest row row_softmax_regs_kernel<kRowThreads, kVecs> takes
static_assert(regs_tile<512, 8> == kMaxRow, "the launcher's last register kernel must cover kMaxRow");

template <int kRowThreads, int kVecs>
void launch_regs(float const* x, float* y, int64_t rows, int cols, cudaStream_t stream) {
  dim3 const grid{unsigned(rows)};  // one CTA per row; braces: `dim3 grid(unsigned(rows));` declares a function
  row_softmax_regs_kernel<kRowThreads, kVecs><<<grid, kRowThreads, 0, stream>>>(x, y, cols);
}

}  // namespace row_softmax_impl

extern "C" int row_softmax(float const* x, float* y, int64_t rows, int64_t cols, cudaStream_t stream) {
  using namespace row_softmax_impl;
  if (rows == 0 || cols == 0) return cudaSuccess;  // an empty grid is a launch error; nothing to do
  if (rows > INT32_MAX || cols > INT32_MAX - kStep) return cudaErrorInvalidValue;  // grid.x and int columns
  bool aligned = reinterpret_cast<uintptr_t>(x) % 16 == 0 && reinterpret_cast<uintptr_t>(y) % 16 == 0
                 && cols % kVec == 0;
  if (aligned && cols <= kMaxRow) {
    // A CTA holds one row, so the bytes an SM has in flight are (CTAs per SM) x (row bytes). Short
    // rows take small CTAs because an SM holds at most 2048 threads and 32 CTAs: 256-thread CTAs on
    // 4 KB rows would leave only 8 rows (32 KB) in flight. From 4096 columns on, the row bytes in
    // flight are bounded by registers (a CTA holds the row whatever its shape); 512 threads with
    // 2 to 8 vectors each measured about 1% faster on an H200 than 256 threads with twice the vectors.
    int const c = int(cols);
    if (c <= regs_tile<64, 1>)        launch_regs<64, 1>(x, y, rows, c, stream);
    else if (c <= regs_tile<64, 2>)   launch_regs<64, 2>(x, y, rows, c, stream);
    else if (c <= regs_tile<64, 4>)   launch_regs<64, 4>(x, y, rows, c, stream);
    else if (c <= regs_tile<128, 4>)  launch_regs<128, 4>(x, y, rows, c, stream);
    else if (c <= regs_tile<512, 2>)  launch_regs<512, 2>(x, y, rows, c, stream);
    else if (c <= regs_tile<512, 4>)  launch_regs<512, 4>(x, y, rows, c, stream);
    else                              launch_regs<512, 8>(x, y, rows, c, stream);
    return cudaGetLastError();
  }
  dim3 const grid{unsigned(rows)};  // one CTA per row (braces: a dim3 can never read as a function)
  if (aligned) {
    row_softmax_kernel<true><<<grid, kThreads, 0, stream>>>(x, y, int(cols));
  } else {
    row_softmax_kernel<false><<<grid, kThreads, 0, stream>>>(x, y, int(cols));
  }
  return cudaGetLastError();
}
"""

kernel = CuteKernel(CUDA_SRC, {"row_softmax": ("f32*", "f32*", "i64", "i64")}, name="row_softmax")


class ModelNew(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = torch.empty_like(x)
        cols = x.shape[-1]
        kernel.row_softmax(x, y, x.numel() // cols if cols else 0, cols)
        return y
