"""Hand-written honest candidate for the evaluator's throughput benchmark (not a model's output).

Task 38 (L1Norm): y = x / mean(|x|, dim=1, keepdim=True) for x of shape (rows, cols) = (32768, 65535).

Sample 1 -- one thread-block cluster per row, the row held in distributed shared memory, so x is
read from DRAM exactly once and y written once. The launcher picks the smallest cluster (1 to 16
CTAs) whose slices of the row fit 64 KiB of shared memory per CTA (three CTAs per SM, so clusters
overlap their load and store phases), else the smallest whose slices fit 224 KiB; the task's rows
of 65535 floats take 4 CTAs of 16384 floats.
* Each CTA copies its slice into shared memory with 128-bit cp.async, all in flight at once. The
  rows start at every offset within a 16-byte line, so a slice is stored at the same offset within
  a 16-byte line as in global memory: source and destination are then aligned at the same element,
  and only the <= 3 + 3 edge floats go through registers.
* The CTA reduces its slice's sum of |x| (consecutive threads on consecutive floats: no bank
  conflicts); warp 0 of every CTA then reads the cluster's partials through DSMEM in rank order,
  so all CTAs get the same d = mean(|x|) = sum / cols bit for bit; y = x / d is written from shared memory
  with 128-bit stores.
Rows too long for 16 x 224 KiB, or a GPU that cannot co-schedule the cluster, take a fallback
kernel of one CTA per row that reads the row twice.

How it differs from the other samples: sample 0 is one CTA per row streaming the row twice from
global memory with peeled 128-bit vectors; sample 2 is two kernels (row reduction into a workspace,
then a flat elementwise division).
"""

import torch
import torch.nn as nn

from cutegen.runtime import CuteKernel

CUDA_SRC = r"""
#include <cstdint>
#include <cuda_runtime.h>
#include <cooperative_groups.h>
#include <cute/tensor.hpp>

// A named namespace: nvcc's host stubs cannot name kernels of an anonymous namespace while
// `using namespace cute` is in scope.
namespace l1_norm_cluster_impl {

using namespace cute;
namespace cg = cooperative_groups;

constexpr int kThreads    = 512;
constexpr int kWarps      = kThreads / 32;
constexpr int kVec        = 4;            // floats per 128-bit access
constexpr int kPadFloats  = 4;            // room to place a slice at its global 16-byte offset
constexpr int kSliceThree = 16 * 1024;    // floats per CTA that let three CTAs share an SM (64 KiB)
constexpr int kSliceOne   = 56 * 1024;    // floats per CTA at one CTA per SM (224 KiB)
constexpr int kMaxCluster = 16;           // above 8 is non-portable: checked at launch
static_assert(sizeof(float) * kVec == 16, "a vector must be exactly one 128-bit access");
static_assert(kThreads % 32 == 0 && kWarps <= 32, "whole warps, and one warp can combine all warps");
static_assert(kMaxCluster <= 32, "one warp gathers one partial per CTA of the cluster");
static_assert((kSliceOne + kPadFloats) * 4 + 1024 <= 227 * 1024, "a slice plus static smem fits one SM");
static_assert(kSliceThree % kVec == 0 && kSliceOne % kVec == 0, "slices start on 16-byte boundaries of the row");

// The per-element term of the reduction: sum of |x|.
__device__ __forceinline__ float term(float v) { return fabsf(v); }

__device__ __forceinline__ float warp_sum(float v) {
  CUTE_UNROLL
  for (int offset = 16; offset > 0; offset /= 2) v += __shfl_xor_sync(0xffffffffu, v, offset);
  return v;
}

// Sum over the CTA, returned to every thread. `smem` holds kWarps + 1 floats.
__device__ __forceinline__ float cta_sum(float v, float* smem) {
  v = warp_sum(v);
  int const warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  if (lane == 0) smem[warp] = v;
  __syncthreads();
  if (warp == 0) {
    v = warp_sum(lane < kWarps ? smem[lane] : 0.0f);
    if (lane == 0) smem[kWarps] = v;
  }
  __syncthreads();
  return smem[kWarps];
}

// One cluster per row; CTA `rank` of the cluster owns columns [rank * slice, (rank + 1) * slice).
__global__ void __launch_bounds__(kThreads, 3)  // <= 40 registers: three CTAs may share an SM
norm_cluster_kernel(float const* __restrict__ x, float* __restrict__ y, int64_t cols, int64_t slice) {
  extern __shared__ uint128_t smem_vecs[];        // dynamic: slice + kPadFloats floats, 16-byte aligned
  __shared__ float sred[kWarps + 1];
  __shared__ float spart;                         // this CTA's partial sum, read by the cluster
  __shared__ float sbcast;
  float* sbuf = reinterpret_cast<float*>(smem_vecs);

  cg::cluster_group cluster = cg::this_cluster();
  int const rank = int(cluster.block_rank());
  int const n = int(cluster.num_blocks());
  int64_t const row = blockIdx.x / n;
  int64_t const begin = min(cols, rank * slice);
  int64_t const count = min(cols, begin + slice) - begin;  // the last CTAs' slices may be short or empty
  // int64 offsets: rows * cols exceeds 2^31 elements.
  float const* px = x + row * cols + begin;
  float* py = y + row * cols + begin;

  // Slice element i lives at sbuf[shift + i], shift = px's float offset inside its 16-byte line.
  int const shift = int((reinterpret_cast<uintptr_t>(px) / sizeof(float)) % kVec);
  int64_t const head = min(count, int64_t((kVec - shift) % kVec));
  int64_t const nvec = (count - head) / kVec;
  int64_t const tail = head + nvec * kVec;

  Tensor gX  = make_tensor(make_gmem_ptr(px), make_shape(count));                                         // (SLICE)
  Tensor gY  = make_tensor(make_gmem_ptr(py), make_shape(count));                                         // (SLICE)
  Tensor sX  = make_tensor(make_smem_ptr(sbuf + shift), make_shape(count));                               // (SLICE)
  Tensor gXv = make_tensor(make_gmem_ptr(px + head), make_layout(make_shape(Int<kVec>{}, nvec)));         // (VEC,NVEC)
  Tensor gYv = make_tensor(make_gmem_ptr(py + head), make_layout(make_shape(Int<kVec>{}, nvec)));         // (VEC,NVEC)
  Tensor sXv = make_tensor(make_smem_ptr(sbuf + shift + head), make_layout(make_shape(Int<kVec>{}, nvec))); // (VEC,NVEC)

  using AsyncCopy = Copy_Atom<SM80_CP_ASYNC_CACHEGLOBAL<uint128_t>, float>;
  for (int64_t v = threadIdx.x; v < nvec; v += kThreads) copy(AsyncCopy{}, gXv(_, v), sXv(_, v));
  cp_async_fence();
  if (threadIdx.x < head) sX(threadIdx.x) = gX(threadIdx.x);
  if (tail + threadIdx.x < count) sX(tail + threadIdx.x) = gX(tail + threadIdx.x);
  cp_async_wait<0>();
  __syncthreads();

  float acc = 0.0f;
  for (int64_t i = threadIdx.x; i < count; i += kThreads) acc += term(sX(i));
  acc = cta_sum(acc, sred);
  if (threadIdx.x == 0) spart = acc;
  cluster.sync();  // every CTA has started and published its partial (DSMEM reads need both)
  if (threadIdx.x < 32) {
    // Lane r reads CTA r's partial; the butterfly runs on the same values in the same lanes in
    // every CTA of the cluster, so all of them divide by the same bits.
    float v = int(threadIdx.x) < n ? *cluster.map_shared_rank(&spart, threadIdx.x) : 0.0f;
    v = warp_sum(v);
    if (threadIdx.x == 0) sbcast = v;
  }
  __syncthreads();
  float const sum = sbcast;
  float const denom = sum / float(cols);  // a zero row gives 0/0 = NaN, as in torch

  // Store: 128-bit when y sits at the same 16-byte offset as x (always for fresh tensors).
  bool const same_offset = int((reinterpret_cast<uintptr_t>(py) / sizeof(float)) % kVec) == shift;
  if (same_offset) {
    using VecCopy = Copy_Atom<UniversalCopy<uint128_t>, float>;
    for (int64_t v = threadIdx.x; v < nvec; v += kThreads) {
      Tensor rY = make_tensor<float>(Shape<Int<kVec>>{});  // (VEC) registers
      copy(VecCopy{}, sXv(_, v), rY);
      CUTE_UNROLL
      for (int e = 0; e < kVec; ++e) rY(e) = rY(e) / denom;
      copy(VecCopy{}, rY, gYv(_, v));
    }
    if (threadIdx.x < head) gY(threadIdx.x) = sX(threadIdx.x) / denom;
    if (tail + threadIdx.x < count) gY(tail + threadIdx.x) = sX(tail + threadIdx.x) / denom;
  } else {
    for (int64_t i = threadIdx.x; i < count; i += kThreads) gY(i) = sX(i) / denom;
  }
  // No CTA may exit (and release its shared memory) while another may still read its partial.
  cluster.sync();
}

// Fallback, any row length: one CTA per row, a reduction sweep, then a division sweep.
__global__ void __launch_bounds__(kThreads)
norm_stream_kernel(float const* __restrict__ x, float* __restrict__ y, int64_t cols) {
  __shared__ float sred[kWarps + 1];
  Tensor gX = make_tensor(make_gmem_ptr(x + int64_t(blockIdx.x) * cols), make_shape(cols));  // (COLS)
  Tensor gY = make_tensor(make_gmem_ptr(y + int64_t(blockIdx.x) * cols), make_shape(cols));  // (COLS)
  float acc = 0.0f;
  for (int64_t i = threadIdx.x; i < cols; i += kThreads) acc += term(gX(i));
  float const sum = cta_sum(acc, sred);
  float const denom = sum / float(cols);
  for (int64_t i = threadIdx.x; i < cols; i += kThreads) gY(i) = gX(i) / denom;
}

// Launch the cluster kernel with n CTAs per row if the GPU can co-schedule such a cluster.
bool try_cluster(float const* x, float* y, int64_t rows, int64_t cols, int n, int64_t slice, cudaStream_t stream) {
  if (rows > INT32_MAX / n) return false;  // grid.x = rows * n
  int const bytes = int((slice + kPadFloats) * sizeof(float));
  if (cudaFuncSetAttribute(norm_cluster_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, bytes) != cudaSuccess ||
      (n > 8 && cudaFuncSetAttribute(norm_cluster_kernel, cudaFuncAttributeNonPortableClusterSizeAllowed, 1) != cudaSuccess)) {
    cudaGetLastError();  // clear the error: the caller falls back to another launch
    return false;
  }
  cudaLaunchAttribute attr[1];
  attr[0].id = cudaLaunchAttributeClusterDimension;
  attr[0].val.clusterDim.x = unsigned(n);
  attr[0].val.clusterDim.y = 1;
  attr[0].val.clusterDim.z = 1;
  cudaLaunchConfig_t config = {};
  config.gridDim = dim3{unsigned(rows * n), 1u, 1u};
  config.blockDim = dim3{unsigned(kThreads), 1u, 1u};
  config.dynamicSmemBytes = size_t(bytes);
  config.stream = stream;
  config.attrs = attr;
  config.numAttrs = 1;
  int clusters = 0;
  if (cudaOccupancyMaxActiveClusters(&clusters, norm_cluster_kernel, &config) != cudaSuccess || clusters < 1) {
    cudaGetLastError();
    return false;
  }
  if (cudaLaunchKernelEx(&config, norm_cluster_kernel, x, y, cols, slice) != cudaSuccess) {
    cudaGetLastError();
    return false;
  }
  return true;
}

int64_t slice_for(int64_t cols, int n) {  // floats per CTA: a multiple of 4, so slices start 16-byte aligned
  return ((cols + n - 1) / n + kVec - 1) / kVec * kVec;
}

}  // namespace l1_norm_cluster_impl

// x, y: (rows, cols) contiguous; y = x / mean(|x|) over each row.
extern "C" int l1_norm_rows(float const* x, float* y, int64_t rows, int64_t cols, cudaStream_t stream) {
  using namespace l1_norm_cluster_impl;
  if (rows == 0 || cols == 0) return cudaSuccess;  // nothing to do; an empty grid is a launch error
  if (rows > INT32_MAX) return cudaErrorInvalidValue;
  // Smallest cluster whose slices let three CTAs share an SM, else the smallest at one CTA per SM.
  for (int64_t cap : {int64_t(kSliceThree), int64_t(kSliceOne)}) {
    for (int n = 1; n <= kMaxCluster; n *= 2) {
      if (slice_for(cols, n) <= cap) {
        if (try_cluster(x, y, rows, cols, n, slice_for(cols, n), stream)) return cudaGetLastError();
        break;  // a bigger cluster at this cap is no easier to schedule: try the next cap
      }
    }
  }
  norm_stream_kernel<<<dim3{unsigned(rows)}, kThreads, 0, stream>>>(x, y, cols);
  return cudaGetLastError();
}
"""

kernel = CuteKernel(CUDA_SRC, {"l1_norm_rows": ("f32*", "f32*", "i64", "i64")}, name="l1_norm_cluster")


class ModelNew(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.dim() != 2:
            raise NotImplementedError("this kernel normalises over dim 1 of a 2-D tensor (the task's shape)")
        x = x.contiguous()
        y = torch.empty_like(x)
        kernel.l1_norm_rows(x, y, x.shape[0], x.shape[1])
        return y
