"""Example candidate for examples/tasks/matmul_bf16.py: C = A @ B in bf16 on Hopper (sm_90a) with TMA
and wgmma, plus a fused-epilogue launcher for y = gelu(x @ W^T + b) (nn.Linear then GELU, bf16).

The structure of a Hopper GEMM, kept as small as it can be while staying fast:
* Warp specialization: a CTA of 3 warpgroups (384 threads). Warpgroup 0 is the producer: one thread
  streams K tiles of A and B into shared memory with TMA (`SM90_TMA_LOAD`; the descriptors are built
  on the host by `make_tma_atom` and passed as `__grid_constant__` kernel parameters). Warpgroups 1
  and 2 are consumers: each runs 64x256x16 wgmma (`SM90_64x256x16_F32BF16BF16_SS`, both operands read
  from shared memory through descriptors) on its 64 rows of the 128x256 tile. `setmaxnreg` moves
  registers from the producer (40) to the consumers (232): 128 fp32 accumulators per thread.
* A 4-stage ring of 128x64 (A) and 256x64 (B) tiles in the canonical GMMA 128-byte-swizzled layouts,
  synchronised by `cutlass::PipelineTmaAsync`: a "full" transaction barrier per stage (TMA arrives
  with the byte count) and an "empty" barrier (consumers release a stage when the wgmma that read it
  has retired: `warpgroup_wait<1>` keeps one batch in flight).
* TMA zero-fills the parts of a box outside the matrix, so any M, N, K work; the epilogue predicates
  the residue tiles. Preconditions (checked by the launcher, which returns cudaErrorInvalidValue):
  K % 8 == 0 and N % 8 == 0 (TMA strides are multiples of 16 bytes), 16-byte aligned pointers.
* B may be N-contiguous ((K,N) row-major, the right operand of torch.matmul: GMMA::Major::MN) or
  K-contiguous ((N,K), an nn.Linear weight: GMMA::Major::K); the swizzle atom and the wgmma's
  operand major-ness follow.
* Grouped rasterization: 16 M-tiles per sweep over N keep the tiles in flight sharing L2.
* Epilogue in registers: optional bias + exact GELU in fp32, one rounding to bf16, 32-bit stores.

Build for sm_90a: plain sm_90 compiles wgmma to nothing (the SASS must contain HGMMA).
"""

import torch
import torch.nn as nn

from cutegen.runtime import CuteKernel

CUDA_SRC = r"""
#include <cstdint>
#include <cuda_runtime.h>
#include <cute/tensor.hpp>
#include <cutlass/arch/barrier.h>
#include <cutlass/arch/reg_reconfig.h>
#include <cutlass/pipeline/sm90_pipeline.hpp>

// A named namespace: nvcc's host stubs cannot name kernels of an anonymous namespace while
// `using namespace cute` is in scope.
namespace gemm_bf16_impl {

using namespace cute;
using Element = cutlass::bfloat16_t;

constexpr int kBlkM = 128;         // CTA tile (M,N,K): two consumer warpgroups of 64 rows each
constexpr int kBlkN = 256;
constexpr int kBlkK = 64;          // 64 bf16 = 128 bytes: one row of the 128-byte swizzle
constexpr int kStages = 4;         // smem ring: 4 x 48 KiB
constexpr int kConsumers = 2;      // MMA warpgroups; warpgroup 0 is the TMA producer
constexpr int kThreads = 128 * (1 + kConsumers);
constexpr int kGroupM = 16;        // tile rasterization: 16 M-tiles share each sweep over N (L2 reuse)
using TileShape = Shape<Int<kBlkM>, Int<kBlkN>, Int<kBlkK>>;

enum : int { kEpiNone = 0, kEpiBiasGelu = 1 };

// MajorB: how B sits in memory. K: (N,K) K-contiguous (an nn.Linear weight); MN: (K,N) row-major,
// i.e. N-contiguous (the right operand of torch.matmul).
template <GMMA::Major MajorB>
struct Config {
  // Stage buffers in the canonical GMMA layouts: TMA writes them swizzled, wgmma reads them through
  // shared-memory descriptors without bank conflicts.
  using SmemLayoutA = decltype(tile_to_shape(GMMA::Layout_K_SW128_Atom<Element>{},
                                             make_shape(Int<kBlkM>{}, Int<kBlkK>{}, Int<kStages>{})));
  using SmemLayoutB = conditional_t<MajorB == GMMA::Major::K,
      decltype(tile_to_shape(GMMA::Layout_K_SW128_Atom<Element>{},
                             make_shape(Int<kBlkN>{}, Int<kBlkK>{}, Int<kStages>{}))),
      decltype(tile_to_shape(GMMA::Layout_MN_SW128_Atom<Element>{},
                             make_shape(Int<kBlkN>{}, Int<kBlkK>{}, Int<kStages>{}), Step<_2, _1, _3>{}))>;
  // 64x256x16 wgmma per warpgroup, two warpgroups stacked along M: a 128x256 tile.
  using TiledMma = decltype(make_tiled_mma(
      GMMA::ss_op_selector<Element, Element, float, Shape<_64, Int<kBlkN>, Int<kBlkK>>, GMMA::Major::K, MajorB>(),
      Layout<Shape<Int<kConsumers>, _1, _1>>{}));
  using Pipeline = cutlass::PipelineTmaAsync<kStages>;
  struct SharedStorage {
    ArrayEngine<Element, cosize_v<SmemLayoutA>> A;  // 16 KiB per stage: every stage starts 1024-aligned
    ArrayEngine<Element, cosize_v<SmemLayoutB>> B;  // 32 KiB per stage
    typename Pipeline::SharedStorage pipeline;      // full/empty mbarrier per stage
  };
  static constexpr uint32_t kTmaBytes = (kBlkM + kBlkN) * kBlkK * sizeof(Element);  // bytes landing per stage
  static constexpr int kSmemBytes = int(sizeof(SharedStorage)) + 1024;               // + room to align to 1024
};

__device__ __forceinline__ float gelu(float x) {  // the exact (erf) GELU of torch.nn.functional.gelu
  return 0.5f * x * (1.0f + erff(x * 0.70710678118654752f));
}

template <class Cfg, int kEpi, class TmaA, class TmaB>
__global__ void __launch_bounds__(kThreads, 1)
gemm_bf16_kernel(CUTE_GRID_CONSTANT TmaA const tma_a, CUTE_GRID_CONSTANT TmaB const tma_b,
                 Element* __restrict__ c, Element const* __restrict__ bias, int m, int n, int k) {
  using Pipeline = typename Cfg::Pipeline;
  using SharedStorage = typename Cfg::SharedStorage;
  // The 128-byte swizzle pattern repeats every 1024 bytes: align the stage buffers to it.
  extern __shared__ char smem_raw[];
  uint32_t const pad = (1024u - cast_smem_ptr_to_uint(smem_raw) % 1024u) % 1024u;
  SharedStorage& smem = *reinterpret_cast<SharedStorage*>(smem_raw + pad);

  // Grouped rasterization: consecutive CTAs walk kGroupM M-tiles down one N column, so the CTAs
  // in flight share their A and B tiles through L2.
  int const tiles_m = (m + kBlkM - 1) / kBlkM;
  int const tiles_n = (n + kBlkN - 1) / kBlkN;
  int const per_group = kGroupM * tiles_n;
  int const first_m = int(blockIdx.x) / per_group * kGroupM;
  int const group_m = min(tiles_m - first_m, kGroupM);
  int const tile_m = first_m + int(blockIdx.x) % per_group % group_m;
  int const tile_n = int(blockIdx.x) % per_group / group_m;

  int const warp_group = threadIdx.x / 128;
  typename Pipeline::Params params;
  params.transaction_bytes = Cfg::kTmaBytes;
  params.role = warp_group == 0 ? Pipeline::ThreadCategory::Producer : Pipeline::ThreadCategory::Consumer;
  params.is_leader = threadIdx.x == 0;  // the one thread that issues TMA and arms the full barriers
  params.num_consumers = 128 * kConsumers;
  Pipeline pipeline(smem.pipeline, params, Shape<_1, _1, _1>{});  // warp 0 initialises the barriers
  __syncthreads();                                                // every thread sees them initialised

  // TMA coordinate tensors: the same (M,K) and (N,K) views the descriptors were made from.
  Tensor mA = tma_a.get_tma_tensor(make_shape(m, k));                             // (M,K)
  Tensor mB = tma_b.get_tma_tensor(make_shape(n, k));                             // (N,K)
  auto cta_coord = make_coord(tile_m, tile_n, _);                                  // (m,n,k)
  Tensor gA = local_tile(mA, TileShape{}, cta_coord, Step<_1, X, _1>{});          // (BLK_M,BLK_K,k)
  Tensor gB = local_tile(mB, TileShape{}, cta_coord, Step<X, _1, _1>{});          // (BLK_N,BLK_K,k)
  Tensor sA = make_tensor(make_smem_ptr(smem.A.begin()), typename Cfg::SmemLayoutA{}); // (BLK_M,BLK_K,PIPE)
  Tensor sB = make_tensor(make_smem_ptr(smem.B.begin()), typename Cfg::SmemLayoutB{}); // (BLK_N,BLK_K,PIPE)
  int const k_tiles = size<2>(gA);

  if (warp_group == 0) {
    // Producer: one thread streams the K tiles of A and B into the ring; TMA zero-fills any part of a
    // box outside the matrix, so residue tiles in M, N and K need no predication here.
    cutlass::arch::warpgroup_reg_dealloc<40>();  // give registers to the consumers
    if (threadIdx.x == 0) {
      auto [tAgA, tAsA] = tma_partition(tma_a, Int<0>{}, Layout<_1>{}, group_modes<0, 2>(sA), group_modes<0, 2>(gA)); // (TMA,k) (TMA,PIPE)
      auto [tBgB, tBsB] = tma_partition(tma_b, Int<0>{}, Layout<_1>{}, group_modes<0, 2>(sB), group_modes<0, 2>(gB)); // (TMA,k) (TMA,PIPE)
      auto write = cutlass::make_producer_start_state<Pipeline>();
      for (int kt = 0; kt < k_tiles; ++kt) {
        pipeline.producer_acquire(write);  // wait until the consumers freed this slot; arm its barrier
        auto* full = pipeline.producer_get_barrier(write);
        copy(tma_a.with(*full), tAgA(_, kt), tAsA(_, write.index()));
        copy(tma_b.with(*full), tBgB(_, kt), tBsB(_, write.index()));
        ++write;
      }
    }
    return;
  }

  // Consumers: two warpgroups, each owns 64 rows of the tile and 128 fp32 accumulators per thread.
  cutlass::arch::warpgroup_reg_alloc<232>();
  typename Cfg::TiledMma tiled_mma;
  auto thr_mma = tiled_mma.get_thread_slice(threadIdx.x - 128);
  Tensor tCsA = thr_mma.partition_A(sA);                                          // (MMA,MMA_M,MMA_K,PIPE)
  Tensor tCsB = thr_mma.partition_B(sB);                                          // (MMA,MMA_N,MMA_K,PIPE)
  Tensor tCrA = thr_mma.make_fragment_A(tCsA);                                    // (MMA,MMA_M,MMA_K,PIPE) smem descriptors
  Tensor tCrB = thr_mma.make_fragment_B(tCsB);                                    // (MMA,MMA_N,MMA_K,PIPE) smem descriptors
  Tensor accum = partition_fragment_C(tiled_mma, take<0, 2>(TileShape{}));        // (MMA,MMA_M,MMA_N) fp32

  cutlass::PipelineState<kStages> read;     // the stage to wait for next
  cutlass::PipelineState<kStages> release;  // the oldest stage still being read by wgmma
  // First K tile: the first wgmma overwrites the accumulators (ScaleOut::Zero), later ones add.
  tiled_mma.accumulate_ = GMMA::ScaleOut::Zero;
  warpgroup_fence_operand(accum);
  pipeline.consumer_wait(read);
  warpgroup_arrive();
  CUTE_UNROLL
  for (int kb = 0; kb < size<2>(tCrA); ++kb) {  // 4 wgmma of K=16 per 64-wide K tile
    gemm(tiled_mma, tCrA(_, _, kb, read.index()), tCrB(_, _, kb, read.index()), accum);
    tiled_mma.accumulate_ = GMMA::ScaleOut::One;
  }
  warpgroup_commit_batch();
  ++read;
  warpgroup_fence_operand(accum);
  for (int kt = 1; kt < k_tiles; ++kt) {
    pipeline.consumer_wait(read);  // this stage's TMA bytes have all landed
    warpgroup_fence_operand(accum);
    warpgroup_arrive();
    gemm(tiled_mma, tCrA(_, _, _, read.index()), tCrB(_, _, _, read.index()), accum);
    warpgroup_commit_batch();
    warpgroup_wait<1>();  // keep this batch in flight; the previous one has finished reading its stage
    warpgroup_fence_operand(accum);
    pipeline.consumer_release(release);  // hand the previous stage back to the producer
    ++release;
    ++read;
  }
  warpgroup_wait<0>();
  warpgroup_fence_operand(accum);

  // Epilogue in registers: optional bias + GELU in fp32, one rounding to bf16, then the store.
  Tensor mC = make_tensor(make_gmem_ptr(c), make_shape(m, n), make_stride(int64_t(n), Int<1>{}));  // (M,N)
  Tensor gC = local_tile(mC, TileShape{}, cta_coord, Step<_1, _1, X>{});          // (BLK_M,BLK_N)
  Tensor cC = local_tile(make_identity_tensor(shape(mC)), TileShape{}, cta_coord, Step<_1, _1, X>{}); // (BLK_M,BLK_N) -> (m,n)
  Tensor tCgC = thr_mma.partition_C(gC);                                          // (MMA,MMA_M,MMA_N)
  Tensor tCcC = thr_mma.partition_C(cC);                                          // (MMA,MMA_M,MMA_N)
  Tensor tCrC = make_tensor_like<Element>(accum);                                 // (MMA,MMA_M,MMA_N) bf16
  CUTE_UNROLL
  for (int i = 0; i < size(accum); ++i) {
    float v = accum(i);
    if constexpr (kEpi == kEpiBiasGelu) {
      int const col = get<1>(tCcC(i));
      v = gelu(v + (col < n ? float(bias[col]) : 0.0f));
    }
    // __fadd_rn(v, 0): without it, nvcc 13.0 packs pairs of raw accumulators into bf16 in a way
    // that makes ptxas serialize every wgmma of the main loop (warning C7514); one FADD each avoids it.
    tCrC(i) = Element(kEpi == kEpiNone ? __fadd_rn(v, 0.0f) : v);
  }
  bool const full_tile = (tile_m + 1) * kBlkM <= m && (tile_n + 1) * kBlkN <= n;
  if (full_tile) {
    // Each thread holds pairs of adjacent columns: 32-bit stores (n % 8 == 0 keeps pairs aligned).
    copy(AutoVectorizingCopyWithAssumedAlignment<32>{}, tCrC, tCgC);
  } else {
    CUTE_UNROLL
    for (int i = 0; i < size(tCrC); ++i) {
      if (elem_less(tCcC(i), shape(mC))) tCgC(i) = tCrC(i);
    }
  }
}

template <GMMA::Major MajorB, int kEpi>
int launch(Element const* a, Element const* b, Element const* bias, Element* c,
           int64_t m, int64_t n, int64_t k, cudaStream_t stream) {
  using Cfg = Config<MajorB>;
  if (m == 0 || n == 0) return cudaSuccess;  // nothing to write; an empty grid is a launch error
  // TMA needs 16-byte aligned bases and row strides (k % 8, n % 8 for bf16); k == 0 has no K tile.
  if (k == 0 || k % 8 != 0 || n % 8 != 0 || m > INT32_MAX || n > INT32_MAX || k > INT32_MAX) {
    return cudaErrorInvalidValue;
  }
  for (void const* p : {static_cast<void const*>(a), static_cast<void const*>(b), static_cast<void const*>(c)}) {
    if (reinterpret_cast<uintptr_t>(p) % 16 != 0) return cudaErrorInvalidValue;
  }
  int const M = int(m), N = int(n), K = int(k);
  Tensor mA = make_tensor(a, make_shape(M, K), make_stride(int64_t(K), Int<1>{}));  // (M,K) K-major
  auto mB = [&] {
    if constexpr (MajorB == GMMA::Major::K) {
      return make_tensor(b, make_shape(N, K), make_stride(int64_t(K), Int<1>{}));    // (N,K) K-major
    } else {
      return make_tensor(b, make_shape(N, K), make_stride(Int<1>{}, int64_t(N)));    // (N,K) N-major
    }
  }();
  auto tma_a = make_tma_atom(SM90_TMA_LOAD{}, mA, typename Cfg::SmemLayoutA{}(_, _, 0),
                             make_shape(Int<kBlkM>{}, Int<kBlkK>{}));
  auto tma_b = make_tma_atom(SM90_TMA_LOAD{}, mB, typename Cfg::SmemLayoutB{}(_, _, 0),
                             make_shape(Int<kBlkN>{}, Int<kBlkK>{}));
  int64_t const tiles = ((m + kBlkM - 1) / kBlkM) * ((n + kBlkN - 1) / kBlkN);
  if (tiles > INT32_MAX) return cudaErrorInvalidValue;
  auto kernel = gemm_bf16_kernel<Cfg, kEpi, decltype(tma_a), decltype(tma_b)>;
  cudaError_t err = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, Cfg::kSmemBytes);
  if (err != cudaSuccess) return err;
  dim3 const grid{unsigned(tiles)};  // braces, not parentheses: `dim3 grid(unsigned(n));` would declare a function
  kernel<<<grid, kThreads, Cfg::kSmemBytes, stream>>>(tma_a, tma_b, c, bias, M, N, K);
  return cudaGetLastError();
}

}  // namespace gemm_bf16_impl

// C = A @ B: A (M,K) row-major, B (K,N) row-major, C (M,N) row-major; bf16 in and out, fp32 accumulate.
extern "C" int gemm_bf16(cutlass::bfloat16_t const* a, cutlass::bfloat16_t const* b, cutlass::bfloat16_t* c,
                         int64_t m, int64_t n, int64_t k, cudaStream_t stream) {
  using namespace gemm_bf16_impl;
  return launch<GMMA::Major::MN, kEpiNone>(a, b, nullptr, c, m, n, k, stream);
}

// C = gelu(A @ W^T + bias): A (M,K), W (N,K) as stored by nn.Linear, bias (N); bf16.
extern "C" int linear_bias_gelu_bf16(cutlass::bfloat16_t const* a, cutlass::bfloat16_t const* w,
                                     cutlass::bfloat16_t const* bias, cutlass::bfloat16_t* c,
                                     int64_t m, int64_t n, int64_t k, cudaStream_t stream) {
  using namespace gemm_bf16_impl;
  return launch<GMMA::Major::K, kEpiBiasGelu>(a, w, bias, c, m, n, k, stream);
}
"""

kernel = CuteKernel(
    CUDA_SRC,
    {
        "gemm_bf16": ("bf16*", "bf16*", "bf16*", "i64", "i64", "i64"),
        "linear_bias_gelu_bf16": ("bf16*", "bf16*", "bf16*", "bf16*", "i64", "i64", "i64"),
    },
    name="gemm_bf16_wgmma",
)


class ModelNew(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, A: torch.Tensor, B: torch.Tensor) -> torch.Tensor:
        m, k = A.shape
        n = B.shape[1]
        C = torch.empty((m, n), dtype=A.dtype, device=A.device)
        kernel.gemm_bf16(A, B, C, m, n, k)
        return C


class LinearGeluNew(nn.Module):
    """gelu(linear(x)) for bf16 x of shape (..., in_features): the fused-epilogue launcher."""

    def __init__(self, in_features: int, out_features: int):
        super().__init__()
        self.linear = nn.Linear(in_features, out_features)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        weight, bias = self.linear.weight, self.linear.bias
        k = x.shape[-1]
        m = x.numel() // k
        n = weight.shape[0]
        y = torch.empty((*x.shape[:-1], n), dtype=x.dtype, device=x.device)
        kernel.linear_bias_gelu_bf16(x, weight, bias, y, m, n, k)
        return y
