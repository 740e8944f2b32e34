"""Example candidate for examples/tasks/matmul.py: C = A @ B for row-major fp32 A (M,K) and B (K,N),
on tensor cores with fp32-level accuracy as the goal (3xTF32).

TF32 tensor cores keep only 10 explicit mantissa bits per operand: plain TF32 fails the fp32 track's
1e-4 tolerance on large K. 3xTF32 splits each operand into big + small TF32 parts and sums three
products per MMA step (small*big, big*small, big*big; small*small, at most 2^-22 of the product and
usually far less, is left out), so each product is accurate to about fp32 precision for three mma.sync
instructions, which are meant to outrun SIMT FFMA (matmul_cute.py) on H100/H200.

Where the accumulation happens matters as much as the split. The tensor core's accumulate step rounds
toward zero (reported in the literature on error-corrected SGEMM emulation on tensor cores, e.g.
Ootomo & Yokota 2022; assumed here to hold for Hopper's mma.sync too). Accumulating all of K inside
the MMA accumulator applies that one-sided rounding to the running sum at every step: the errors
share the sign of the running sum, so they add up coherently and the error grows faster with K than
the round-to-nearest error of an fp32 sum. This kernel keeps the long sum out of the tensor core: per
k-step of 8 and per MMA atom, the three MMAs accumulate into a zeroed 4-value temporary, and that
partial sum is promoted into the fp32 accumulator with an ordinary fp32 add (round to nearest). The
round-toward-zero errors that remain are relative to one k-step's partial sum and change sign with
it, so they no longer grow with the running sum. The intent is an error comparable to an fp32 FFMA
GEMM; the result is not bitwise equal to torch.matmul.

Structure, per 128x128 tile of C (one CTA of 256 threads, two CTAs per SM):
* A and B move from global to shared memory with 16-byte `cp.async` into a 3-stage ring of 128x32
  tiles (32 KiB per stage, dynamic shared memory). The zero-fill variant of the copy atom
  (SM80_CP_ASYNC_CACHEGLOBAL_ZFILL) writes zeros for vectors outside the matrix, so any M, N and K
  work (K and N multiples of 4 for 16-byte alignment) without a special residue path.
* Shared-memory layouts are swizzled (Swizzle<3,2,3> for K-major A, Swizzle<2,3,4> for N-major B) so
  that the MMA fragment reads are free of bank conflicts and the cp.async vectors stay contiguous.
* A TiledMMA of SM80_16x8x8_F32TF32TF32F32_TN over 2x4 warps; each thread holds 64 fp32
  accumulators. Per k-step, the B fragments of all 4 N atoms are read from shared memory and split
  once, then each A atom in turn is read, split and multiplied against them: only one A atom's
  big/small values are live at a time, which leaves registers for the temporaries under the
  128-register budget of two CTAs per SM.
* Grouped tile rasterization: consecutive CTAs share A rows and B columns through L2.
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
namespace matmul_3xtf32_impl {

using namespace cute;
using TF32 = cutlass::tfloat32_t;

constexpr int kThreads = 256;                       // 8 warps: 2 (M) x 4 (N)
constexpr int kBlkM = 128, kBlkN = 128, kBlkK = 32;  // CTA tile (M,N,K)
constexpr int kStages = 3;                          // cp.async ring: 3 x 32 KiB
constexpr int kGroupM = 8;                          // tile rasterization for L2 reuse
using BlkM = Int<kBlkM>;
using BlkN = Int<kBlkN>;
using BlkK = Int<kBlkK>;

// sA (M,K,PIPE): K-major rows of 32 floats. Swizzle<3,2,3> XORs the row (mod 8) into the 16-byte
// column group, so the MMA's fragment reads (8 rows x 4 columns per warp) hit 32 different banks
// while each 16-byte cp.async destination stays contiguous.
using SmemLayoutA = decltype(composition(Swizzle<3, 2, 3>{},
    Layout<Shape<BlkM, BlkK, Int<kStages>>, Stride<BlkK, _1, Int<kBlkM * kBlkK>>>{}));
// sB (N,K,PIPE): N-major rows of 128 floats (B is row-major (K,N) in memory). Swizzle<2,3,4> XORs
// k (mod 4) into bits 3-4 of n: the fragment reads (4 k x 8 n per warp) become conflict-free.
using SmemLayoutB = decltype(composition(Swizzle<2, 3, 4>{},
    Layout<Shape<BlkN, BlkK, Int<kStages>>, Stride<_1, BlkN, Int<kBlkN * kBlkK>>>{}));
constexpr int kSmemBytes = int(sizeof(float)) * (cosize_v<SmemLayoutA> + cosize_v<SmemLayoutB>);

// x = big + small, both TF32 (a TF32 MMA ignores the low 13 mantissa bits of its fp32 registers).
// * big: x rounded to nearest TF32 (add half a TF32 ulp to the bit pattern, then mask: round half
//   away from zero; a carry into the exponent is still correct). Masked, it is an exact TF32 value,
//   so small = x - big is exact in fp32 (close values). Rounding rather than truncating makes
//   |small| <= half a TF32 ulp of x, and small's sign carries one more bit of x.
// * small: has at most 12 significant bits, one more than TF32 keeps, and the MMA truncates that
//   last bit. That bit is worth exactly half of small's TF32 ulp, so rounding small would always be a
//   tie: it would only turn the error (0 or 1 fp32 ulp of x) from toward zero to away from zero, for
//   one more instruction per value. So big + small is within one fp32 ulp of x (three ulps if big
//   were truncated too).
// cvt.rna.tf32.f32 compiles to this same add and mask plus an Inf/NaN test, which changes nothing
// here (an Inf or NaN x makes small NaN either way).
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

// (kThreads, 2): at most 128 registers, so two CTAs (16 warps) share an SM and hide latency.
__global__ void __launch_bounds__(kThreads, 2)
matmul_3xtf32_kernel(float const* __restrict__ a, float const* __restrict__ b, float* __restrict__ c,
                     int m, int n, int k) {
  // Grouped rasterization: consecutive CTAs walk kGroupM M-tiles down one N column (L2 reuse).
  int const tiles_m = (m + kBlkM - 1) / kBlkM;
  int const tiles_n = (n + kBlkN - 1) / kBlkN;
  int const per_group = kGroupM * tiles_n;
  int const first_m = int(blockIdx.x) / per_group * kGroupM;
  int const group_m = min(tiles_m - first_m, kGroupM);
  int const tile_m = first_m + int(blockIdx.x) % per_group % group_m;
  int const tile_n = int(blockIdx.x) % per_group / group_m;

  // Global tensors with K as the second mode: A (M,K) K-major, B as (N,K) N-major, C (M,N).
  Tensor mA = make_tensor(make_gmem_ptr(a), make_shape(m, k), make_stride(int64_t(k), Int<1>{}));  // (M,K)
  Tensor mB = make_tensor(make_gmem_ptr(b), make_shape(n, k), make_stride(Int<1>{}, int64_t(n)));  // (N,K)
  Tensor mC = make_tensor(make_gmem_ptr(c), make_shape(m, n), make_stride(int64_t(n), Int<1>{}));  // (M,N)
  auto cta_tiler = make_shape(BlkM{}, BlkN{}, BlkK{});                            // (BLK_M,BLK_N,BLK_K)
  auto cta_coord = make_coord(tile_m, tile_n, _);                                  // (m,n,k)
  Tensor gA = local_tile(mA, cta_tiler, cta_coord, Step<_1, X, _1>{});            // (BLK_M,BLK_K,k)
  Tensor gB = local_tile(mB, cta_tiler, cta_coord, Step<X, _1, _1>{});            // (BLK_N,BLK_K,k)
  Tensor gC = local_tile(mC, cta_tiler, cta_coord, Step<_1, _1, X>{});            // (BLK_M,BLK_N)
  // Identity tensors, tiled like the data: the logical (row, col) of every element, for predicates.
  Tensor cA = local_tile(make_identity_tensor(shape(mA)), cta_tiler, cta_coord, Step<_1, X, _1>{}); // (BLK_M,BLK_K,k)
  Tensor cB = local_tile(make_identity_tensor(shape(mB)), cta_tiler, cta_coord, Step<X, _1, _1>{}); // (BLK_N,BLK_K,k)
  Tensor cC = local_tile(make_identity_tensor(shape(mC)), cta_tiler, cta_coord, Step<_1, _1, X>{}); // (BLK_M,BLK_N)

  extern __shared__ float4 smem_raw[];  // float4: 16-byte alignment for the cp.async targets
  float* smem = reinterpret_cast<float*>(smem_raw);
  Tensor sA = make_tensor(make_smem_ptr(smem), SmemLayoutA{});                    // (BLK_M,BLK_K,PIPE)
  Tensor sB = make_tensor(make_smem_ptr(smem + cosize_v<SmemLayoutA>), SmemLayoutB{}); // (BLK_N,BLK_K,PIPE)

  // Global -> shared: 16-byte cp.async (.cg: the tiles are reused from smem, not L1). The ZFILL
  // variant writes zeros where the predicate is false: rows past M/N and columns past K become 0,
  // so the residue tiles need no other special case.
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

  // A vector is loaded when its first element is in bounds: K % 4 == 0 and N % 4 == 0 (checked by
  // the launcher) make every vector either wholly inside or wholly outside the matrix.
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

  // Tensor cores: m16n8k8 TF32 mma.sync, 2x4 warps; the 32x32 atom tile repeats 4x4 over 128x128,
  // so each thread accumulates 64 fp32 values.
  TiledMMA mma = make_tiled_mma(SM80_16x8x8_F32TF32TF32F32_TN{}, Layout<Shape<_2, _4, _1>>{});
  ThrMMA thr_mma = mma.get_slice(threadIdx.x);
  Tensor tCsA = thr_mma.partition_A(sA);                                          // (MMA,MMA_M,MMA_K,PIPE) fp32 smem
  Tensor tCsB = thr_mma.partition_B(sB);                                          // (MMA,MMA_N,MMA_K,PIPE) fp32 smem
  // Operand registers for one k-block only: B for every MMA_N atom (reused by all 4 A atoms), A for
  // one MMA_M atom at a time. Fewer live values than splitting all of A up front.
  Tensor tCrA_big = make_fragment_like<TF32>(tCsA(_, 0, 0, 0));                   // (MMA) tf32
  Tensor tCrA_small = make_fragment_like<TF32>(tCsA(_, 0, 0, 0));                 // (MMA) tf32
  Tensor tCrB_big = make_fragment_like<TF32>(tCsB(_, _, 0, 0));                   // (MMA,MMA_N) tf32
  Tensor tCrB_small = make_fragment_like<TF32>(tCsB(_, _, 0, 0));                 // (MMA,MMA_N) tf32
  Tensor tCgC = thr_mma.partition_C(gC);                                          // (MMA,MMA_M,MMA_N)
  Tensor tCcC = thr_mma.partition_C(cC);                                          // (MMA,MMA_M,MMA_N)
  Tensor tCrC = thr_mma.make_fragment_C(tCgC);                                    // (MMA,MMA_M,MMA_N) fp32
  // One atom's partial sum over one k-block, accumulated by the tensor core from zero.
  Tensor tCrC_step = make_fragment_like(tCrC(_, 0, 0));                           // (MMA) fp32
  clear(tCrC);

  CUTE_STATIC_ASSERT_V(size(mma) == Int<kThreads>{});
  CUTE_STATIC_ASSERT_V(size(copyA) == Int<kThreads>{} && size(copyB) == Int<kThreads>{});
  // The k-block loop walks A's MMA_M and B's MMA_N atoms with C's extents.
  CUTE_STATIC_ASSERT_V(size<1>(tCsA) == size<1>(tCrC) && size<1>(tCsB) == size<2>(tCrC));

  int const k_tiles = size<2>(gA);
  // Prologue: tiles 0..kStages-2 in flight; a commit group is closed even when empty, so that
  // "kStages-2 groups pending" always means "the oldest tile has landed".
  CUTE_UNROLL
  for (int s = 0; s < kStages - 1; ++s) {
    if (s < k_tiles) load_tile(s, s);
    cp_async_fence();
  }
  for (int kt = 0; kt < k_tiles; ++kt) {
    cp_async_wait<kStages - 2>();  // this thread's copies of tile kt have landed...
    __syncthreads();               // ...everyone's too, and everyone is done reading tile kt-1's slot
    int const next = kt + kStages - 1;
    if (next < k_tiles) load_tile(next, next % kStages);  // refills tile kt-1's slot
    cp_async_fence();
    int const stage = kt % kStages;
    CUTE_UNROLL
    for (int kb = 0; kb < size<2>(tCsA); ++kb) {  // 4 k-blocks of 8
      split_tf32(tCsB(_, _, kb, stage), tCrB_big, tCrB_small);                    // all MMA_N atoms of B
      CUTE_UNROLL
      for (int mi = 0; mi < size<1>(tCrC); ++mi) {
        split_tf32(tCsA(_, mi, kb, stage), tCrA_big, tCrA_small);                 // one MMA_M atom of A
        CUTE_UNROLL
        for (int ni = 0; ni < size<2>(tCrC); ++ni) {
          // The tensor core rounds its sums toward zero: give it only this k-block's 24 products,
          // starting from zero, small terms first (they are summed while the partial sum is small).
          clear(tCrC_step);
          gemm(mma, tCrA_small, tCrB_big(_, ni), tCrC_step);                      // (MMA) x (MMA) => (MMA)
          gemm(mma, tCrA_big, tCrB_small(_, ni), tCrC_step);
          gemm(mma, tCrA_big, tCrB_big(_, ni), tCrC_step);
          // The long sum over K: an ordinary fp32 add, which rounds to nearest (unbiased).
          CUTE_UNROLL
          for (int i = 0; i < size(tCrC_step); ++i) {
            tCrC(i, mi, ni) += tCrC_step(i);
          }
        }
      }
    }
  }

  // Epilogue: each thread holds pairs of adjacent columns (64-bit stores when the tile is whole).
  bool const full_tile = (tile_m + 1) * kBlkM <= m && (tile_n + 1) * kBlkN <= n;
  if (full_tile) {
    copy(AutoVectorizingCopyWithAssumedAlignment<64>{}, tCrC, tCgC);
  } else {
    CUTE_UNROLL
    for (int i = 0; i < size(tCrC); ++i) {
      if (elem_less(tCcC(i), shape(mC))) tCgC(i) = tCrC(i);
    }
  }
}

}  // namespace matmul_3xtf32_impl

// C = A @ B, fp32 in and out, A (M,K), B (K,N), C (M,N) row-major; 3xTF32 on tensor cores.
extern "C" int matmul_3xtf32(float const* a, float const* b, float* c, int64_t m, int64_t n, int64_t k,
                             cudaStream_t stream) {
  using namespace matmul_3xtf32_impl;
  if (m == 0 || n == 0) return cudaSuccess;  // nothing to write; an empty grid is a launch error
  // 16-byte vectors: rows of A and B must start 16-byte aligned (K % 4, N % 4, aligned pointers).
  if (k == 0 || k % 4 != 0 || n % 4 != 0 || m > INT32_MAX || n > INT32_MAX || k > INT32_MAX) {
    return cudaErrorInvalidValue;
  }
  for (void const* p : {static_cast<void const*>(a), static_cast<void const*>(b), static_cast<void const*>(c)}) {
    if (reinterpret_cast<uintptr_t>(p) % 16 != 0) return cudaErrorInvalidValue;
  }
  int64_t const tiles = ((m + kBlkM - 1) / kBlkM) * ((n + kBlkN - 1) / kBlkN);
  if (tiles > INT32_MAX) return cudaErrorInvalidValue;
  // Over 48 KiB of dynamic shared memory must be opted into, per kernel.
  cudaError_t err = cudaFuncSetAttribute(matmul_3xtf32_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                         kSmemBytes);
  if (err != cudaSuccess) return err;
  dim3 const grid{unsigned(tiles)};  // braces, not parentheses: `dim3 grid(unsigned(n));` would declare a function
  matmul_3xtf32_kernel<<<grid, kThreads, kSmemBytes, stream>>>(a, b, c, int(m), int(n), int(k));
  return cudaGetLastError();
}
"""

kernel = CuteKernel(
    CUDA_SRC, {"matmul_3xtf32": ("f32*", "f32*", "f32*", "i64", "i64", "i64")}, name="matmul_3xtf32"
)


class ModelNew(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, A: torch.Tensor, B: torch.Tensor) -> torch.Tensor:
        m, k = A.shape
        n = B.shape[1]
        C = torch.empty((m, n), dtype=A.dtype, device=A.device)
        kernel.matmul_3xtf32(A, B, C, m, n, k)
        return C
