"""Example candidate for examples/tasks/conv2d.py: y = Conv2d(x) (NCHW, any kernel size, stride,
padding and dilation, groups = 1, optional bias), fp32-accurate on tensor cores.

Implicit GEMM: the convolution is the GEMM C[m, ko] = sum_kk A[m, kk] * B[ko, kk] with
  m  = (n, p, q)  an output pixel            M = N * P * Q
  ko              an output channel          (the GEMM's N) = K_out
  kk = (r, s, c)  a filter tap and channel   (the GEMM's K) = R * S * C
  A[m, kk] = x[n, c, p*stride - pad + r*dil, q*stride - pad + s*dil]   (0 outside the image)
  B[ko, kk] = w[ko, c, r, s]
A is never materialised: each k-tile of A is gathered from x straight into shared memory. The K loop
runs over filter taps (r, s) outside and channel blocks of 32 inside, so within one k-tile the tap is
fixed: every thread checks the padding once per tile for its pixel and then walks channels by a
constant stride (H*W). The gathers are 4-byte `cp.async` with zero fill (padding, channel and pixel
residues all become zeros in shared memory). Consecutive threads take consecutive pixels, so for
stride 1 a warp reads 128 contiguous bytes of a row of x.

The math is the 3xTF32 scheme of matmul_3xtf32_cute.py (big/small TF32 split, three mma.sync per
step), so the result holds the fp32 track's 1e-4 tolerance. The epilogue adds the bias and writes y
in NCHW: for a fixed output channel consecutive pixels are consecutive addresses.
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
namespace conv2d_impl {

using namespace cute;
using TF32 = cutlass::tfloat32_t;

constexpr int kThreads = 256;                       // 8 warps: 2 (M) x 4 (N)
constexpr int kBlkM = 128, kBlkN = 128, kBlkK = 32;  // CTA tile: pixels x output channels x (tap, channels)
constexpr int kStages = 3;                          // cp.async ring: 3 x 32 KiB
using BlkM = Int<kBlkM>;
using BlkN = Int<kBlkN>;
using BlkK = Int<kBlkK>;

// Both operand tiles are MN-major (pixels / output channels contiguous) with the same swizzle:
// k (mod 4) XORed into bits 3-4 of the row, which makes the MMA fragment reads conflict-free.
using SmemLayout = decltype(composition(Swizzle<2, 3, 4>{},
    Layout<Shape<BlkM, BlkK, Int<kStages>>, Stride<_1, BlkM, Int<kBlkM * kBlkK>>>{}));
static_assert(kBlkM == kBlkN, "A and B share one shared-memory layout");
constexpr int kSmemBytes = 2 * int(sizeof(float)) * cosize_v<SmemLayout>;

struct ConvShape {
  int n, c, h, w;          // input (N, C, H, W)
  int k, r, s;             // filter (K, C, R, S)
  int p, q;                // output (P, Q)
  int stride_h, stride_w, pad_h, pad_w, dil_h, dil_w;
};

// See matmul_3xtf32_cute.py: x = big + small, both TF32 (the MMA ignores the low 13 bits).
template <class Src, class Big, class Small>
__device__ __forceinline__ void split_tf32(Src const& src, Big&& big, Small&& small) {  // &&: slices are temporaries
  CUTE_UNROLL
  for (int i = 0; i < size(src); ++i) {
    float const x = src(i);
    float const hi = __uint_as_float((__float_as_uint(x) + 0x1000u) & 0xffffe000u);
    big(i) = TF32::bitcast(__float_as_uint(hi));
    small(i) = TF32::bitcast(__float_as_uint(x - hi));
  }
}

// (kThreads, 2): at most 128 registers, so two CTAs share an SM.
__global__ void __launch_bounds__(kThreads, 2)
conv2d_kernel(float const* __restrict__ x, float const* __restrict__ w, float const* __restrict__ bias,
              float* __restrict__ y, ConvShape cs) {
  int const gemm_m = cs.n * cs.p * cs.q;                 // launcher checked it fits in int
  int const tiles_m = (gemm_m + kBlkM - 1) / kBlkM;
  int const tile_m = int(blockIdx.x) % tiles_m;          // M fastest: CTAs in flight share the filter
  int const tile_n = int(blockIdx.x) / tiles_m;
  int64_t const hw = int64_t(cs.h) * cs.w;
  int const crs = cs.c * cs.r * cs.s;
  int const c_blocks = (cs.c + kBlkK - 1) / kBlkK;
  int const k_tiles = cs.r * cs.s * c_blocks;

  extern __shared__ float4 smem_raw[];  // float4: aligned for any cp.async width
  float* smem = reinterpret_cast<float*>(smem_raw);
  Tensor sA = make_tensor(make_smem_ptr(smem), SmemLayout{});                     // (BLK_M,BLK_K,PIPE)
  Tensor sB = make_tensor(make_smem_ptr(smem + cosize_v<SmemLayout>), SmemLayout{}); // (BLK_N,BLK_K,PIPE)

  // Gathers: thread t owns row t % 128 of the tile (a pixel for A, an output channel for B) and
  // the k columns t / 128 + 2j, j = 0..15. The copy atom only fixes the shared-memory side; the
  // global address of each element is computed here.
  using GatherAtom = Copy_Atom<SM80_CP_ASYNC_CACHEALWAYS_ZFILL<uint32_t>, float>;
  TiledCopy gather = make_tiled_copy(GatherAtom{}, Layout<Shape<_128, _2>>{},    // (THR_ROW,THR_K) rows fastest
                                     Layout<Shape<_1, _1>>{});
  ThrCopy thr_gather = gather.get_slice(threadIdx.x);
  Tensor tAsA = thr_gather.partition_D(sA);                                       // (CPY,CPY_M,CPY_K,PIPE)
  Tensor tBsB = thr_gather.partition_D(sB);                                       // (CPY,CPY_N,CPY_K,PIPE)
  Tensor cT = make_identity_tensor(make_shape(BlkM{}, BlkK{}));                   // (BLK,BLK_K) -> (row,k)
  Tensor tTcT = thr_gather.partition_D(cT);                                       // (CPY,CPY_ROW,CPY_K)
  CUTE_STATIC_ASSERT_V(size<1>(tAsA) == _1{});  // one row per thread: its pixel is decoded once
  int const row = get<0>(tTcT(0, 0, 0));                                        // pixel / channel row

  // This thread's pixel (for A) and output channel (for B).
  int const m = tile_m * kBlkM + row;
  int const img = m / (cs.p * cs.q);
  int const pq = m % (cs.p * cs.q);
  int const ih0 = pq / cs.q * cs.stride_h - cs.pad_h;
  int const iw0 = pq % cs.q * cs.stride_w - cs.pad_w;
  float const* x_img = x + int64_t(img) * cs.c * hw;
  int const ko = tile_n * kBlkN + row;
  float const* w_row = w + int64_t(ko) * crs;

  auto load_tile = [&](int kt, int stage) {
    int const rs = kt / c_blocks;                       // filter tap of this k-tile
    int const c0 = kt % c_blocks * kBlkK;               // first channel of this k-tile
    int const r = rs / cs.s, s = rs % cs.s;
    int const ih = ih0 + r * cs.dil_h, iw = iw0 + s * cs.dil_w;
    bool const pixel_in = m < gemm_m && 0 <= ih && ih < cs.h && 0 <= iw && iw < cs.w;
    float const* src_a = x_img + int64_t(ih) * cs.w + iw;
    float const* src_b = w_row + r * cs.s + s;
    CUTE_UNROLL
    for (int j = 0; j < size<2>(tAsA); ++j) {
      int const c = c0 + get<1>(tTcT(0, 0, j));         // this element's input channel
      bool const a_in = pixel_in && c < cs.c;
      bool const b_in = ko < cs.k && c < cs.c;
      // A zero-filled element reads nothing: its address may point anywhere, so use a valid one.
      Tensor src_a_elem = make_tensor(make_gmem_ptr(a_in ? src_a + c * hw : x), Layout<_1>{});               // (1)
      Tensor src_b_elem = make_tensor(make_gmem_ptr(b_in ? src_b + c * cs.r * cs.s : w), Layout<_1>{});     // (1)
      copy(GatherAtom{}.with(a_in), src_a_elem, tAsA(_, 0, j, stage));
      copy(GatherAtom{}.with(b_in), src_b_elem, tBsB(_, 0, j, stage));
    }
  };

  // Tensor cores: m16n8k8 TF32 mma.sync, 2x4 warps, 64 fp32 accumulators per thread.
  TiledMMA mma = make_tiled_mma(SM80_16x8x8_F32TF32TF32F32_TN{}, Layout<Shape<_2, _4, _1>>{});
  ThrMMA thr_mma = mma.get_slice(threadIdx.x);
  Tensor tCsA = thr_mma.partition_A(sA);                                          // (MMA,MMA_M,MMA_K,PIPE) fp32 smem
  Tensor tCsB = thr_mma.partition_B(sB);                                          // (MMA,MMA_N,MMA_K,PIPE) fp32 smem
  Tensor tCrA = thr_mma.partition_fragment_A(sA(_, _, 0));                        // (MMA,MMA_M,MMA_K) tf32 big
  Tensor tCrB = thr_mma.partition_fragment_B(sB(_, _, 0));                        // (MMA,MMA_N,MMA_K) tf32 big
  Tensor tCrA_small = make_fragment_like(tCrA);                                   // (MMA,MMA_M,MMA_K) tf32 small
  Tensor tCrB_small = make_fragment_like(tCrB);                                   // (MMA,MMA_N,MMA_K) tf32 small
  Tensor cC = make_identity_tensor(make_shape(BlkM{}, BlkN{}));                   // (BLK_M,BLK_N) -> (row,col)
  Tensor tCcC = thr_mma.partition_C(cC);                                          // (MMA,MMA_M,MMA_N)
  Tensor tCrC = partition_fragment_C(mma, make_shape(BlkM{}, BlkN{}));            // (MMA,MMA_M,MMA_N) fp32
  clear(tCrC);
  CUTE_STATIC_ASSERT_V(size(mma) == Int<kThreads>{} && size(gather) == Int<kThreads>{});

  // The same cp.async ring as the GEMM: kStages-1 tiles in flight, one barrier per k-tile.
  CUTE_UNROLL
  for (int st = 0; st < kStages - 1; ++st) {
    if (st < k_tiles) load_tile(st, st);
    cp_async_fence();
  }
  for (int kt = 0; kt < k_tiles; ++kt) {
    cp_async_wait<kStages - 2>();
    __syncthreads();
    int const next = kt + kStages - 1;
    if (next < k_tiles) load_tile(next, next % kStages);
    cp_async_fence();
    int const stage = kt % kStages;
    CUTE_UNROLL
    for (int kb = 0; kb < size<2>(tCrA); ++kb) {
      split_tf32(tCsA(_, _, kb, stage), tCrA(_, _, kb), tCrA_small(_, _, kb));
      split_tf32(tCsB(_, _, kb, stage), tCrB(_, _, kb), tCrB_small(_, _, kb));
      gemm(mma, tCrA_small(_, _, kb), tCrB(_, _, kb), tCrC);
      gemm(mma, tCrA(_, _, kb), tCrB_small(_, _, kb), tCrC);
      gemm(mma, tCrA(_, _, kb), tCrB(_, _, kb), tCrC);
    }
  }

  // Epilogue: + bias, store to NCHW. Pixel (img, pq) and channel ko live at
  // y[img * K * P * Q + ko * P * Q + pq]; rows past M and channels past K are skipped.
  int64_t const out_pq = int64_t(cs.p) * cs.q;
  CUTE_UNROLL
  for (int i = 0; i < size(tCrC); ++i) {
    int const mm = tile_m * kBlkM + get<0>(tCcC(i));
    int const kk = tile_n * kBlkN + get<1>(tCcC(i));
    if (mm < gemm_m && kk < cs.k) {
      float const v = tCrC(i) + (bias != nullptr ? bias[kk] : 0.0f);
      y[(int64_t(mm) / out_pq * cs.k + kk) * out_pq + int64_t(mm) % out_pq] = v;
    }
  }
}

}  // namespace conv2d_impl

// y = conv2d(x, w) + bias. x (N,C,H,W), w (K,C,R,S), bias (K) or ignored when has_bias == 0,
// y (N,K,P,Q); all contiguous fp32.
extern "C" int conv2d(float const* x, float const* w, float const* bias, float* y,
                      int64_t n, int64_t c, int64_t h, int64_t wd, int64_t k, int64_t r, int64_t s,
                      int64_t stride_h, int64_t stride_w, int64_t pad_h, int64_t pad_w,
                      int64_t dil_h, int64_t dil_w, int32_t has_bias, cudaStream_t stream) {
  using namespace conv2d_impl;
  if (stride_h < 1 || stride_w < 1 || dil_h < 1 || dil_w < 1 || pad_h < 0 || pad_w < 0) return cudaErrorInvalidValue;
  int64_t const p = (h + 2 * pad_h - dil_h * (r - 1) - 1) / stride_h + 1;
  int64_t const q = (wd + 2 * pad_w - dil_w * (s - 1) - 1) / stride_w + 1;
  if (n <= 0 || k <= 0 || p <= 0 || q <= 0) return cudaSuccess;  // empty output: nothing to do
  if (c <= 0 || r <= 0 || s <= 0) return cudaErrorInvalidValue;
  // int indices inside the kernel: pixel count, channel*tap count and per-image planes must fit.
  if (n * p * q > INT32_MAX - kBlkM || c * r * s > INT32_MAX || h * wd > INT32_MAX || k > INT32_MAX - kBlkN) {
    return cudaErrorInvalidValue;
  }
  ConvShape cs{int(n), int(c), int(h), int(wd), int(k), int(r), int(s), int(p), int(q),
               int(stride_h), int(stride_w), int(pad_h), int(pad_w), int(dil_h), int(dil_w)};
  int64_t const tiles = ((n * p * q + kBlkM - 1) / kBlkM) * ((k + kBlkN - 1) / kBlkN);
  if (tiles > INT32_MAX) return cudaErrorInvalidValue;
  cudaError_t err = cudaFuncSetAttribute(conv2d_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, kSmemBytes);
  if (err != cudaSuccess) return err;
  dim3 const grid{unsigned(tiles)};  // braces, not parentheses: `dim3 grid(unsigned(n));` would declare a function
  conv2d_kernel<<<grid, kThreads, kSmemBytes, stream>>>(x, w, has_bias ? bias : nullptr, y, cs);
  return cudaGetLastError();
}
"""

kernel = CuteKernel(
    CUDA_SRC,
    {"conv2d": ("f32*", "f32*", "f32*", "f32*", "i64", "i64", "i64", "i64", "i64", "i64", "i64",
                "i64", "i64", "i64", "i64", "i64", "i64", "i32")},
    name="conv2d",
)


def _pair(v):
    return (v, v) if isinstance(v, int) else tuple(v)


class ModelNew(nn.Module):
    def __init__(self, in_channels: int, out_channels: int):
        super().__init__()
        # The reference's layer, for its parameters (same names and init); its settings are read below.
        self.conv = nn.Conv2d(in_channels, out_channels, kernel_size=3, padding=1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        conv = self.conv
        weight = conv.weight
        n, c, h, w = x.shape
        k, _, r, s = weight.shape
        (sh, sw), (ph, pw), (dh, dw) = _pair(conv.stride), _pair(conv.padding), _pair(conv.dilation)
        p = (h + 2 * ph - dh * (r - 1) - 1) // sh + 1
        q = (w + 2 * pw - dw * (s - 1) - 1) // sw + 1
        y = torch.empty((n, k, p, q), dtype=x.dtype, device=x.device)
        has_bias = conv.bias is not None
        bias = conv.bias if has_bias else weight  # any f32 tensor: the kernel ignores it
        kernel.conv2d(x, weight, bias, y, n, c, h, w, k, r, s, sh, sw, ph, pw, dh, dw, int(has_bias))
        return y
