// Plain-CUDA building blocks that the cuda knowledge pack (src/cutegen/templates/knowledge_cuda/)
// quotes: every ```cuda excerpt there is a verbatim slice of this file (tests/test_knowledge.py), and
// this file builds for sm_90a through the project's runtime (tests/test_knowledge_pitfalls.py), so the
// excerpts a model is shown compile. Written for the pack, not by a model.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cuda_bf16.h>
#include <cuda_runtime.h>

namespace pack_cuda {

constexpr int kThreads = 256;  // threads per block: whole warps

// ------------------------------------------------------------------- vectorized elementwise

__device__ __forceinline__ float relu_op(float v) { return v < 0.f ? 0.f : v; }  // NaN stays NaN

// 128-bit loads and stores (one float4 per access) in a grid-stride loop.
__global__ void __launch_bounds__(kThreads)
relu_vec4_kernel(float4 const* __restrict__ x, float4* __restrict__ y, int64_t n4) {
  int64_t const stride = int64_t(gridDim.x) * blockDim.x;
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n4; i += stride) {
    float4 const v = __ldg(x + i);
    y[i] = make_float4(relu_op(v.x), relu_op(v.y), relu_op(v.z), relu_op(v.w));
  }
}

// Elements [begin, n) one at a time: the tail after the vectors, or everything when unaligned.
__global__ void __launch_bounds__(kThreads)
relu_scalar_kernel(float const* __restrict__ x, float* __restrict__ y, int64_t begin, int64_t n) {
  int64_t const stride = int64_t(gridDim.x) * blockDim.x;
  for (int64_t i = begin + int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += stride) {
    y[i] = relu_op(x[i]);
  }
}

// ------------------------------------------------------------------- warp and block reductions

__device__ __forceinline__ float warp_sum(float v) {
#pragma unroll
  for (int offset = 16; offset > 0; offset >>= 1) v += __shfl_xor_sync(0xffffffffu, v, offset);
  return v;  // every lane holds the warp's sum
}

__device__ __forceinline__ float warp_max(float v) {
#pragma unroll
  for (int offset = 16; offset > 0; offset >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, offset));
  return v;
}

// The block's sum in every thread: each warp's sum goes through shared memory (`scratch`: 32
// floats), then every warp reduces the warp sums. blockDim.x must be a multiple of 32.
__device__ __forceinline__ float block_sum(float v, float* scratch) {
  int const lane = threadIdx.x % 32, warp = threadIdx.x / 32, warps = blockDim.x / 32;
  v = warp_sum(v);
  __syncthreads();  // an earlier call may still be reading scratch
  if (lane == 0) scratch[warp] = v;
  __syncthreads();
  return warp_sum(lane < warps ? scratch[lane] : 0.f);
}

__device__ __forceinline__ float block_max(float v, float* scratch) {
  int const lane = threadIdx.x % 32, warp = threadIdx.x / 32, warps = blockDim.x / 32;
  v = warp_max(v);
  __syncthreads();
  if (lane == 0) scratch[warp] = v;
  __syncthreads();
  return warp_max(lane < warps ? scratch[lane] : -INFINITY);
}

// One block per row: the row maximum, the sum of exponentials, then the normalised values.
__global__ void __launch_bounds__(kThreads)
row_softmax_kernel(float const* __restrict__ x, float* __restrict__ y, int64_t cols) {
  __shared__ float scratch[32];
  float const* row = x + int64_t(blockIdx.x) * cols;
  float* out = y + int64_t(blockIdx.x) * cols;
  float m = -INFINITY;
  for (int64_t c = threadIdx.x; c < cols; c += blockDim.x) m = fmaxf(m, row[c]);
  m = block_max(m, scratch);
  float s = 0.f;
  for (int64_t c = threadIdx.x; c < cols; c += blockDim.x) s += expf(row[c] - m);
  float const inv = 1.f / block_sum(s, scratch);
  for (int64_t c = threadIdx.x; c < cols; c += blockDim.x) out[c] = expf(row[c] - m) * inv;
}

// ------------------------------------------------------------------- cp.async (sm_80+)

// Global -> shared without passing through registers, 16 bytes per instruction.
__device__ __forceinline__ void cp_async_16(void* smem, void const* gmem) {
  uint32_t const dst = static_cast<uint32_t>(__cvta_generic_to_shared(smem));
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\n" ::"r"(dst), "l"(gmem));
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::); }
template <int kPending>  // wait until at most kPending committed groups are still in flight
__device__ __forceinline__ void cp_async_wait() { asm volatile("cp.async.wait_group %0;\n" ::"n"(kPending)); }

// One stage of a load pipeline: each thread stages a 16-byte chunk in shared memory, then the block
// reads the tile back (here: thread i writes the chunk of thread kThreads - 1 - i).
__global__ void __launch_bounds__(kThreads)
staged_reverse_kernel(float4 const* __restrict__ x, float4* __restrict__ y, int64_t n4) {
  __shared__ float4 tile[kThreads];
  int64_t const base = int64_t(blockIdx.x) * kThreads;
  if (base + threadIdx.x < n4) cp_async_16(&tile[threadIdx.x], x + base + threadIdx.x);
  cp_async_commit();
  cp_async_wait<0>();
  __syncthreads();  // the wait covers this thread's copies; the barrier makes all of them visible
  int const from = kThreads - 1 - threadIdx.x;
  if (base + from < n4) y[base + threadIdx.x] = tile[from];
}

// ------------------------------------------------------------------- tensor cores: mma.sync

// D (16x8, fp32) += A (16x16, bf16, row) * B (16x8, bf16, col) for one warp. With g = lane / 4 and
// t = lane % 4, each 32-bit register packs two bf16 (the lower index in the low half):
//   a[0] = A[g][2t, 2t+1]    a[1] = A[g+8][2t, 2t+1]    a[2] = A[g][2t+8, 2t+9]    a[3] = A[g+8][2t+8, 2t+9]
//   b[0] = B[2t, 2t+1][g]    b[1] = B[2t+8, 2t+9][g]
//   d[0], d[1] = D[g][2t, 2t+1]    d[2], d[3] = D[g+8][2t, 2t+1]
__device__ __forceinline__ void mma_bf16_16816(float (&d)[4], uint32_t const (&a)[4], uint32_t const (&b)[2]) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 "
      "{%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, {%0, %1, %2, %3};\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
}

__device__ __forceinline__ uint32_t pack_bf16(__nv_bfloat16 lo, __nv_bfloat16 hi) {
  return uint32_t(__bfloat16_as_ushort(lo)) | (uint32_t(__bfloat16_as_ushort(hi)) << 16);
}

// C (M x N, fp32) = A (M x K) * B (K x N), bf16, both row-major: one warp per 16x8 tile of C, operands
// read straight from global memory. The fragment mapping above, in its simplest use; a fast GEMM
// stages tiles in shared memory (cp.async, ldmatrix) and gives each warp many tiles.
__global__ void mma_gemm_bf16_kernel(__nv_bfloat16 const* __restrict__ A, __nv_bfloat16 const* __restrict__ B,
                                     float* __restrict__ C, int N, int K) {
  int const lane = threadIdx.x % 32, g = lane / 4, t = lane % 4;
  int const m0 = blockIdx.y * 16;
  int const n0 = (blockIdx.x * (blockDim.x / 32) + threadIdx.x / 32) * 8;
  if (n0 >= N) return;  // whole warps leave together: mma.sync needs all 32 lanes
  float d[4] = {0.f, 0.f, 0.f, 0.f};
  for (int k0 = 0; k0 < K; k0 += 16) {
    auto a_at = [&](int r, int c) {  // two neighbouring bf16 of a row of A: one aligned 32-bit load
      return *reinterpret_cast<uint32_t const*>(A + int64_t(m0 + r) * K + k0 + c);
    };
    auto b_at = [&](int r) {  // B[r][n], B[r + 1][n]: two rows apart in memory, packed by hand
      return pack_bf16(B[int64_t(k0 + r) * N + n0 + g], B[int64_t(k0 + r + 1) * N + n0 + g]);
    };
    uint32_t const a[4] = {a_at(g, 2 * t), a_at(g + 8, 2 * t), a_at(g, 2 * t + 8), a_at(g + 8, 2 * t + 8)};
    uint32_t const b[2] = {b_at(2 * t), b_at(2 * t + 8)};
    mma_bf16_16816(d, a, b);
  }
  float* c = C + int64_t(m0 + g) * N + n0 + 2 * t;
  c[0] = d[0];
  c[1] = d[1];
  c += int64_t(8) * N;
  c[0] = d[2];
  c[1] = d[3];
}

}  // namespace pack_cuda

extern "C" int relu(float const* x, float* y, int64_t n, cudaStream_t stream) {
  using namespace pack_cuda;
  if (n == 0) return cudaSuccess;  // an empty grid is a launch error
  bool const aligned = reinterpret_cast<uintptr_t>(x) % 16 == 0 && reinterpret_cast<uintptr_t>(y) % 16 == 0;
  int64_t const n4 = aligned ? n / 4 : 0;
  int64_t const max_blocks = 132 * 8;  // a few waves of the H200's 132 SMs; the loops cover the rest
  dim3 const block{unsigned(kThreads)};
  if (n4 > 0) {
    dim3 const grid{unsigned(std::min<int64_t>((n4 + kThreads - 1) / kThreads, max_blocks))};
    relu_vec4_kernel<<<grid, block, 0, stream>>>(reinterpret_cast<float4 const*>(x), reinterpret_cast<float4*>(y), n4);
  }
  if (n > 4 * n4) {
    dim3 const grid{unsigned(std::min<int64_t>((n - 4 * n4 + kThreads - 1) / kThreads, max_blocks))};
    relu_scalar_kernel<<<grid, block, 0, stream>>>(x, y, 4 * n4, n);
  }
  return cudaGetLastError();
}

extern "C" int row_softmax(float const* x, float* y, int64_t rows, int64_t cols, cudaStream_t stream) {
  using namespace pack_cuda;
  if (rows == 0 || cols == 0) return cudaSuccess;
  if (rows > INT32_MAX) return cudaErrorInvalidValue;
  dim3 const grid{unsigned(rows)};
  dim3 const block{unsigned(kThreads)};
  row_softmax_kernel<<<grid, block, 0, stream>>>(x, y, cols);
  return cudaGetLastError();
}

extern "C" int staged_reverse(float const* x, float* y, int64_t n4, cudaStream_t stream) {
  using namespace pack_cuda;
  if (n4 == 0) return cudaSuccess;
  dim3 const grid{unsigned((n4 + kThreads - 1) / kThreads)};
  dim3 const block{unsigned(kThreads)};
  staged_reverse_kernel<<<grid, block, 0, stream>>>(reinterpret_cast<float4 const*>(x), reinterpret_cast<float4*>(y), n4);
  return cudaGetLastError();
}

extern "C" int mma_gemm_bf16(__nv_bfloat16 const* a, __nv_bfloat16 const* b, float* c, int64_t m, int64_t n,
                             int64_t k, cudaStream_t stream) {
  using namespace pack_cuda;
  constexpr int kWarps = 4;  // warps per block, each one 16x8 tile
  if (m % 16 != 0 || n % 8 != 0 || k % 16 != 0 || m / 16 > 65535 || n > INT32_MAX || k > INT32_MAX) {
    return cudaErrorInvalidValue;  // the kernel handles whole tiles only
  }
  if (m == 0 || n == 0) return cudaSuccess;
  dim3 const grid{unsigned((n / 8 + kWarps - 1) / kWarps), unsigned(m / 16)};
  dim3 const block{unsigned(32 * kWarps)};
  mma_gemm_bf16_kernel<<<grid, block, 0, stream>>>(a, b, c, int(n), int(k));
  return cudaGetLastError();
}
