# backend: cute
"""An honest structure-exploiting candidate for KernelBench level1/14 (C = triu(A @ B) with A and B
upper triangular, N = 4096), in CuTe: the 3xTF32 tensor-core GEMM of
examples/candidates/matmul_3xtf32_cute.py (read its docstring for the split and the accumulation),
restricted to the tiles and the K range that the task's stated structure leaves non-zero.

With 128 x 128 tiles of C, tile (m, n):
* m > n lies below the diagonal: triu() makes it zero, and the CTA only writes zeros.
* m <= n: C[r][c] = sum_k A[r][k] B[k][c], where A[r][k] = 0 for k < r and B[k][c] = 0 for k > c. For
  every row r of tile m and column c of tile n, the non-zero terms have k in [128 m, 128 (n + 1)), so
  the CTA walks only those K tiles: n - m + 1 of the 32 a dense GEMM walks.
* m == n (the diagonal): the elements with r > c are set to zero, as triu() does.
That is sum over m <= n of (n - m + 1) = 5984 of the dense product's 32768 tile products (18%, against
the 1/6 of an exact triangular product). The work differs by up to 32x between tiles, so the CTAs are
numbered longest first (diagonal n - m = 31 down to 0, then the zero tiles): the scheduler hands the
long tiles out in the first wave and fills the SMs with short ones behind them.

The result is not bitwise torch's: 3xTF32 products, and the K sum in another order (an honest
reordering of fp32 sums, judged against the fp64 result by the precision rule).
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
namespace triu_matmul_3xtf32_impl {

using namespace cute;
using TF32 = cutlass::tfloat32_t;

constexpr int kThreads = 256;                       // 8 warps: 2 (M) x 4 (N)
constexpr int kBlkM = 128, kBlkN = 128, kBlkK = 32;  // CTA tile (M,N,K); kBlkM == kBlkN: square tiles
constexpr int kStages = 3;                          // cp.async ring: 3 x 32 KiB
using BlkM = Int<kBlkM>;
using BlkN = Int<kBlkN>;
using BlkK = Int<kBlkK>;

// sA (M,K,PIPE): K-major rows of 32 floats, Swizzle<3,2,3>; sB (N,K,PIPE): N-major rows of 128 floats,
// Swizzle<2,3,4>. Both make the MMA fragment reads conflict-free (see matmul_3xtf32_cute.py).
using SmemLayoutA = decltype(composition(Swizzle<3, 2, 3>{},
    Layout<Shape<BlkM, BlkK, Int<kStages>>, Stride<BlkK, _1, Int<kBlkM * kBlkK>>>{}));
using SmemLayoutB = decltype(composition(Swizzle<2, 3, 4>{},
    Layout<Shape<BlkN, BlkK, Int<kStages>>, Stride<_1, BlkN, Int<kBlkN * kBlkK>>>{}));
constexpr int kSmemBytes = int(sizeof(float)) * (cosize_v<SmemLayoutA> + cosize_v<SmemLayoutB>);

// x = big + small, both TF32: big is x rounded to nearest TF32, small = x - big (exact in fp32).
template <class Src, class Big, class Small>
__device__ __forceinline__ void split_tf32(Src const& src, Big&& big, Small&& small) {  // &&: slices are temporaries
  CUTE_UNROLL
  for (int i = 0; i < size(src); ++i) {
    float const x = src(i);
    float const hi = __uint_as_float((__float_as_uint(x) + 0x1000u) & 0xffffe000u);  // round half away
    big(i) = TF32::bitcast(__float_as_uint(hi));
    small(i) = TF32::bitcast(__float_as_uint(x - hi));
  }
}

// CTA number -> (tile_m, tile_n), longest first: the upper tiles by diagonal d = n - m from tiles-1
// down to 0 (diagonal d holds tiles - d tiles of d + 1 K-tile rows each), then the zero tiles below
// the diagonal, row by row. At most `tiles` steps of a loop, once per CTA.
__device__ __forceinline__ void tile_of(int cta, int tiles, int& tile_m, int& tile_n) {
  for (int d = tiles - 1; d >= 0; --d) {
    if (cta < tiles - d) { tile_m = cta; tile_n = cta + d; return; }
    cta -= tiles - d;
  }
  for (int m = 1; m < tiles; ++m) {  // below the diagonal: row m has m tiles (n = 0..m-1)
    if (cta < m) { tile_m = m; tile_n = cta; return; }
    cta -= m;
  }
  tile_m = tile_n = tiles;  // past the grid: never reached with grid = tiles * tiles
}

// (kThreads, 2): at most 128 registers, so two CTAs (16 warps) share an SM and hide latency.
__global__ void __launch_bounds__(kThreads, 2)
triu_matmul_3xtf32_kernel(float const* __restrict__ a, float const* __restrict__ b, float* __restrict__ c, int n) {
  int const tiles = (n + kBlkM - 1) / kBlkM;
  int tile_m, tile_n;
  tile_of(int(blockIdx.x), tiles, tile_m, tile_n);

  Tensor mA = make_tensor(make_gmem_ptr(a), make_shape(n, n), make_stride(int64_t(n), Int<1>{}));  // (M,K)
  Tensor mB = make_tensor(make_gmem_ptr(b), make_shape(n, n), make_stride(Int<1>{}, int64_t(n)));  // (N,K)
  Tensor mC = make_tensor(make_gmem_ptr(c), make_shape(n, n), make_stride(int64_t(n), Int<1>{}));  // (M,N)
  auto cta_tiler = make_shape(BlkM{}, BlkN{}, BlkK{});                            // (BLK_M,BLK_N,BLK_K)
  auto cta_coord = make_coord(tile_m, tile_n, _);                                  // (m,n,k)
  Tensor gC = local_tile(mC, cta_tiler, cta_coord, Step<_1, _1, X>{});            // (BLK_M,BLK_N)
  Tensor cC = local_tile(make_identity_tensor(shape(mC)), cta_tiler, cta_coord, Step<_1, _1, X>{}); // (BLK_M,BLK_N)

  if (tile_m > tile_n) {
    // Below the diagonal: zeros, one 16-byte vector per thread per step where the row is whole
    // (n % 4 == 0, checked by the launcher, keeps every vector inside or outside the matrix).
    for (int v = threadIdx.x; v < kBlkM * kBlkN / 4; v += kThreads) {
      int const row = v / (kBlkN / 4), col = v % (kBlkN / 4) * 4;
      if (elem_less(cC(row, col), shape(mC))) {
        *reinterpret_cast<float4*>(&gC(row, col)) = make_float4(0.f, 0.f, 0.f, 0.f);
      }
    }
    return;
  }

  Tensor gA = local_tile(mA, cta_tiler, cta_coord, Step<_1, X, _1>{});            // (BLK_M,BLK_K,k)
  Tensor gB = local_tile(mB, cta_tiler, cta_coord, Step<X, _1, _1>{});            // (BLK_N,BLK_K,k)
  Tensor cA = local_tile(make_identity_tensor(shape(mA)), cta_tiler, cta_coord, Step<_1, X, _1>{}); // (BLK_M,BLK_K,k)
  Tensor cB = local_tile(make_identity_tensor(shape(mB)), cta_tiler, cta_coord, Step<X, _1, _1>{}); // (BLK_N,BLK_K,k)

  extern __shared__ float4 smem_raw[];  // float4: 16-byte alignment for the cp.async targets
  float* smem = reinterpret_cast<float*>(smem_raw);
  Tensor sA = make_tensor(make_smem_ptr(smem), SmemLayoutA{});                    // (BLK_M,BLK_K,PIPE)
  Tensor sB = make_tensor(make_smem_ptr(smem + cosize_v<SmemLayoutA>), SmemLayoutB{}); // (BLK_N,BLK_K,PIPE)

  // Global -> shared: 16-byte cp.async.cg, zero-filled outside the matrix (the residue tiles).
  using CopyAtom = Copy_Atom<SM80_CP_ASYNC_CACHEGLOBAL_ZFILL<uint128_t>, float>;
  TiledCopy copyA = make_tiled_copy(CopyAtom{}, Layout<Shape<_32, _8>, Stride<_8, _1>>{},  // (THR_M,THR_K) K fastest
                                    Layout<Shape<_1, _4>>{});                             // 4 floats along K
  TiledCopy copyB = make_tiled_copy(CopyAtom{}, Layout<Shape<_32, _8>, Stride<_1, _32>>{}, // (THR_N,THR_K) N fastest
                                    Layout<Shape<_4, _1>>{});                             // 4 floats along N
  ThrCopy thr_copy_a = copyA.get_slice(threadIdx.x);
  Tensor tAgA = thr_copy_a.partition_S(gA);                                       // (CPY,CPY_M,CPY_K,k)
  Tensor tAcA = thr_copy_a.partition_S(cA);                                       // (CPY,CPY_M,CPY_K,k)
  Tensor tAsA = thr_copy_a.partition_D(sA);                                       // (CPY,CPY_M,CPY_K,PIPE)
  ThrCopy thr_copy_b = copyB.get_slice(threadIdx.x);
  Tensor tBgB = thr_copy_b.partition_S(gB);                                       // (CPY,CPY_N,CPY_K,k)
  Tensor tBcB = thr_copy_b.partition_S(cB);                                       // (CPY,CPY_N,CPY_K,k)
  Tensor tBsB = thr_copy_b.partition_D(sB);                                       // (CPY,CPY_N,CPY_K,PIPE)

  auto load_tile = [&](int kt, int stage) {
    CUTE_UNROLL
    for (int i = 0; i < size<1>(tAgA); ++i) {
      CUTE_UNROLL
      for (int j = 0; j < size<2>(tAgA); ++j) {
        bool const in = elem_less(tAcA(0, i, j, kt), shape(mA));
        copy(CopyAtom{}.with(in), tAgA(_, i, j, kt), tAsA(_, i, j, stage));
      }
    }
    CUTE_UNROLL
    for (int i = 0; i < size<1>(tBgB); ++i) {
      CUTE_UNROLL
      for (int j = 0; j < size<2>(tBgB); ++j) {
        bool const in = elem_less(tBcB(0, i, j, kt), shape(mB));
        copy(CopyAtom{}.with(in), tBgB(_, i, j, kt), tBsB(_, i, j, stage));
      }
    }
  };

  // m16n8k8 TF32 mma.sync over 2x4 warps; 64 fp32 accumulators per thread (see matmul_3xtf32_cute.py).
  TiledMMA mma = make_tiled_mma(SM80_16x8x8_F32TF32TF32F32_TN{}, Layout<Shape<_2, _4, _1>>{});
  ThrMMA thr_mma = mma.get_slice(threadIdx.x);
  Tensor tCsA = thr_mma.partition_A(sA);                                          // (MMA,MMA_M,MMA_K,PIPE) fp32 smem
  Tensor tCsB = thr_mma.partition_B(sB);                                          // (MMA,MMA_N,MMA_K,PIPE) fp32 smem
  Tensor tCrA_big = make_fragment_like<TF32>(tCsA(_, 0, 0, 0));                   // (MMA) tf32
  Tensor tCrA_small = make_fragment_like<TF32>(tCsA(_, 0, 0, 0));                 // (MMA) tf32
  Tensor tCrB_big = make_fragment_like<TF32>(tCsB(_, _, 0, 0));                   // (MMA,MMA_N) tf32
  Tensor tCrB_small = make_fragment_like<TF32>(tCsB(_, _, 0, 0));                 // (MMA,MMA_N) tf32
  Tensor tCgC = thr_mma.partition_C(gC);                                          // (MMA,MMA_M,MMA_N)
  Tensor tCcC = thr_mma.partition_C(cC);                                          // (MMA,MMA_M,MMA_N)
  Tensor tCrC = thr_mma.make_fragment_C(tCgC);                                    // (MMA,MMA_M,MMA_N) fp32
  Tensor tCrC_step = make_fragment_like(tCrC(_, 0, 0));                           // (MMA) fp32
  clear(tCrC);

  CUTE_STATIC_ASSERT_V(size(mma) == Int<kThreads>{});
  CUTE_STATIC_ASSERT_V(size(copyA) == Int<kThreads>{} && size(copyB) == Int<kThreads>{});
  CUTE_STATIC_ASSERT_V(size<1>(tCsA) == size<1>(tCrC) && size<1>(tCsB) == size<2>(tCrC));

  // The K tiles that can hold non-zero terms: from the first column of row tile m (A is zero left of
  // its diagonal) to the last row of column tile n (B is zero below its diagonal).
  int const kt_begin = tile_m * kBlkM / kBlkK;
  int const kt_end = min((tile_n + 1) * kBlkN, n + kBlkK - 1) / kBlkK;  // the last, partial K tile included
  int const k_tiles = kt_end - kt_begin;
  CUTE_UNROLL
  for (int s = 0; s < kStages - 1; ++s) {
    if (s < k_tiles) load_tile(kt_begin + s, s);
    cp_async_fence();  // closed even when empty: "kStages-2 groups pending" means the oldest has landed
  }
  for (int i = 0; i < k_tiles; ++i) {
    cp_async_wait<kStages - 2>();  // this thread's copies of step i have landed...
    __syncthreads();               // ...everyone's too, and everyone is done reading step i-1's slot
    int const next = i + kStages - 1;
    if (next < k_tiles) load_tile(kt_begin + next, next % kStages);  // refills step i-1's slot
    cp_async_fence();
    int const stage = i % kStages;
    CUTE_UNROLL
    for (int kb = 0; kb < size<2>(tCsA); ++kb) {  // 4 k-blocks of 8
      split_tf32(tCsB(_, _, kb, stage), tCrB_big, tCrB_small);                    // all MMA_N atoms of B
      CUTE_UNROLL
      for (int mi = 0; mi < size<1>(tCrC); ++mi) {
        split_tf32(tCsA(_, mi, kb, stage), tCrA_big, tCrA_small);                 // one MMA_M atom of A
        CUTE_UNROLL
        for (int ni = 0; ni < size<2>(tCrC); ++ni) {
          // One k-block's products from zero on the tensor core (which rounds toward zero), small
          // terms first; the long sum over K is an fp32 add, rounded to nearest.
          clear(tCrC_step);
          gemm(mma, tCrA_small, tCrB_big(_, ni), tCrC_step);                      // (MMA) x (MMA) => (MMA)
          gemm(mma, tCrA_big, tCrB_small(_, ni), tCrC_step);
          gemm(mma, tCrA_big, tCrB_big(_, ni), tCrC_step);
          CUTE_UNROLL
          for (int j = 0; j < size(tCrC_step); ++j) {
            tCrC(j, mi, ni) += tCrC_step(j);
          }
        }
      }
    }
  }

  // triu(): on a diagonal tile, the elements below the diagonal are zero whatever the inputs hold.
  if (tile_m == tile_n) {
    CUTE_UNROLL
    for (int i = 0; i < size(tCrC); ++i) {
      if (get<0>(tCcC(i)) > get<1>(tCcC(i))) tCrC(i) = 0.f;
    }
  }
  bool const full_tile = (tile_m + 1) * kBlkM <= n && (tile_n + 1) * kBlkN <= n;
  if (full_tile) {
    copy(AutoVectorizingCopyWithAssumedAlignment<64>{}, tCrC, tCgC);  // pairs of adjacent columns
  } else {
    CUTE_UNROLL
    for (int i = 0; i < size(tCrC); ++i) {
      if (elem_less(tCcC(i), shape(mC))) tCgC(i) = tCrC(i);
    }
  }
}

}  // namespace triu_matmul_3xtf32_impl

// C = triu(A @ B) for upper triangular fp32 A and B, all (N,N) row-major; 3xTF32 on tensor cores.
extern "C" int triu_matmul_3xtf32(float const* a, float const* b, float* c, int64_t n, cudaStream_t stream) {
  using namespace triu_matmul_3xtf32_impl;
  if (n == 0) return cudaSuccess;  // nothing to write; an empty grid is a launch error
  // 16-byte vectors: rows must start 16-byte aligned (N % 4, aligned pointers).
  if (n % 4 != 0 || n > INT32_MAX / 2) return cudaErrorInvalidValue;
  for (void const* p : {static_cast<void const*>(a), static_cast<void const*>(b), static_cast<void const*>(c)}) {
    if (reinterpret_cast<uintptr_t>(p) % 16 != 0) return cudaErrorInvalidValue;
  }
  int64_t const tiles = (n + kBlkM - 1) / kBlkM;
  if (tiles * tiles > INT32_MAX) return cudaErrorInvalidValue;
  cudaError_t err = cudaFuncSetAttribute(triu_matmul_3xtf32_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                         kSmemBytes);  // over 48 KiB must be opted into, per kernel
  if (err != cudaSuccess) return err;
  dim3 const grid{unsigned(tiles * tiles)};  // every tile, the zero ones included
  triu_matmul_3xtf32_kernel<<<grid, kThreads, kSmemBytes, stream>>>(a, b, c, int(n));
  return cudaGetLastError();
}
"""

kernel = CuteKernel(CUDA_SRC, {"triu_matmul_3xtf32": ("f32*", "f32*", "f32*", "i64")}, name="triu_matmul_3xtf32")


class ModelNew(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, A: torch.Tensor, B: torch.Tensor) -> torch.Tensor:
        n = A.shape[0]
        C = torch.empty((n, n), dtype=A.dtype, device=A.device)
        kernel.triu_matmul_3xtf32(A, B, C, n)
        return C
