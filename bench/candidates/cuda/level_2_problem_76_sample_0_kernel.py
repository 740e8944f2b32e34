"""Hand-written honest plain-CUDA candidate in KernelBench format (not a model's output).

Task level2/76_Gemm_Add_ReLU: y = relu(x @ W^T + bias) for float32 x (M x K),
the nn.Linear weight W (N x K, no Linear bias) and the separate bias Parameter
(N), with M = 1024, K = N = 8192 in the task.  ModelNew creates gemm and bias
exactly as the task's Model does (same names, same order), so with the same
seed its parameters are bitwise equal; forward passes them to the kernel.

A shared-memory tiled SIMT GEMM that accumulates every dot product in double.
Each fp32*fp32 product is exact in double and the K-long sum (K = 8192) keeps
~40 more bits than a float sum; the bias is added in double and the sum is
rounded to float once before the ReLU (NaN passes through the ReLU, as in
torch.relu).  A plain fp32 in-order sum misses the 1e-4 tolerance on hundreds
of elements at this K.
  * CTA tile 128 x 128, K step 16, 256 threads, each thread an 8 x 8 block of
    double accumulators (rows ty*4+{0..3} and 64+ty*4+{0..3}, likewise columns,
    so shared-memory reads are 16-byte double2 loads without bank conflicts
    across a half-warp).
  * Both operands are K-contiguous (x rows and W rows).  Tiles are loaded from
    global memory as float4 along K (scalar when K is not a multiple of 4 or a
    base is misaligned), converted to double once when stored to shared
    memory, both transposed to k-major, so the inner loop is pure
    DFMA + LDS.128.  The next tile's global loads are issued before the current
    tile's math to hide their latency.
  * Edges are zero-filled on load and masked on store; offsets are 64-bit.
"""
import torch
import torch.nn as nn
from torch.utils.cpp_extension import load_inline

cuda_source = r"""
#include <torch/extension.h>
#include <ATen/cuda/CUDAContext.h>
#include <cuda_runtime.h>
#include <cstdint>

constexpr int BM = 128, BN = 128, BK = 16;
constexpr int kThreads = 256;  // 16 x 16 threads, 8 x 8 outputs each

// Naming inside the kernel: A = x (M x K, row-major), B = W (N x K, row-major),
// so C[m][n] = sum_k A[m][k] * B[n][k].
// Loads of one K-step, held in registers between the global read and the
// shared-memory store (8 x values and 8 W values per thread).
struct TileRegs { float a[8]; float b[8]; };

template <bool VEC>
__device__ __forceinline__ void load_tiles(TileRegs& t, const float* __restrict__ A,
                                           const float* __restrict__ B, int64_t M, int64_t N,
                                           int64_t K, int64_t m0, int64_t n0, int64_t k0, int tid) {
    if (VEC) {
        // A tile 128 x 16: thread reads rows tid/4 and tid/4 + 64, k = (tid%4)*4..+3.
#pragma unroll
        for (int h = 0; h < 2; ++h) {
            const int64_t gm = m0 + (tid >> 2) + 64 * h;
            const int64_t gk = k0 + (tid & 3) * 4;
            float4 v = make_float4(0.f, 0.f, 0.f, 0.f);
            if (gm < M && gk < K) v = *reinterpret_cast<const float4*>(A + gm * K + gk);
            t.a[4 * h + 0] = v.x; t.a[4 * h + 1] = v.y; t.a[4 * h + 2] = v.z; t.a[4 * h + 3] = v.w;
        }
        // W tile 128 (n) x 16 (k): same pattern as A, rows n = tid/4 and tid/4 + 64.
#pragma unroll
        for (int h = 0; h < 2; ++h) {
            const int64_t gn = n0 + (tid >> 2) + 64 * h;
            const int64_t gk = k0 + (tid & 3) * 4;
            float4 v = make_float4(0.f, 0.f, 0.f, 0.f);
            if (gn < N && gk < K) v = *reinterpret_cast<const float4*>(B + gn * K + gk);
            t.b[4 * h + 0] = v.x; t.b[4 * h + 1] = v.y; t.b[4 * h + 2] = v.z; t.b[4 * h + 3] = v.w;
        }
    } else {
#pragma unroll
        for (int j = 0; j < 8; ++j) {
            const int e = tid + kThreads * j;            // 0..2047
            const int64_t gm = m0 + (e >> 4), gk = k0 + (e & 15);
            t.a[j] = (gm < M && gk < K) ? A[gm * K + gk] : 0.f;
            const int64_t gn = n0 + (e >> 4);
            t.b[j] = (gn < N && gk < K) ? B[gn * K + gk] : 0.f;
        }
    }
}

template <bool VEC>
__device__ __forceinline__ void store_tiles(const TileRegs& t, double (*As)[BM], double (*Bs)[BN], int tid) {
    if (VEC) {
#pragma unroll
        for (int h = 0; h < 2; ++h) {
            const int m = (tid >> 2) + 64 * h, k = (tid & 3) * 4;
#pragma unroll
            for (int q = 0; q < 4; ++q) As[k + q][m] = (double)t.a[4 * h + q];
        }
#pragma unroll
        for (int h = 0; h < 2; ++h) {
            const int n = (tid >> 2) + 64 * h, k = (tid & 3) * 4;
#pragma unroll
            for (int q = 0; q < 4; ++q) Bs[k + q][n] = (double)t.b[4 * h + q];
        }
    } else {
#pragma unroll
        for (int j = 0; j < 8; ++j) {
            const int e = tid + kThreads * j;
            As[e & 15][e >> 4] = (double)t.a[j];
            Bs[e & 15][e >> 4] = (double)t.b[j];
        }
    }
}

template <bool VEC>
__global__ void __launch_bounds__(kThreads, 1)
gemm_bias_relu_kernel(const float* __restrict__ A, const float* __restrict__ B,
                      const float* __restrict__ bias, float* __restrict__ C, int64_t M, int64_t N, int64_t K) {
    __shared__ __align__(16) double As[BK][BM];  // k-major: As[k][m]
    __shared__ __align__(16) double Bs[BK][BN];  // k-major: Bs[k][n] = W[n][k]
    const int tid = threadIdx.x;
    const int tx = tid & 15, ty = tid >> 4;
    const int64_t m0 = (int64_t)blockIdx.y * BM, n0 = (int64_t)blockIdx.x * BN;

    double acc[8][8];
#pragma unroll
    for (int i = 0; i < 8; ++i)
#pragma unroll
        for (int j = 0; j < 8; ++j) acc[i][j] = 0.0;

    TileRegs t;
    load_tiles<VEC>(t, A, B, M, N, K, m0, n0, 0, tid);
    for (int64_t k0 = 0; k0 < K; k0 += BK) {
        store_tiles<VEC>(t, As, Bs, tid);
        __syncthreads();
        if (k0 + BK < K) load_tiles<VEC>(t, A, B, M, N, K, m0, n0, k0 + BK, tid);  // in flight during the math
#pragma unroll
        for (int kk = 0; kk < BK; ++kk) {
            double a[8], b[8];
            const double2* ar = reinterpret_cast<const double2*>(&As[kk][0]);
            const double2* br = reinterpret_cast<const double2*>(&Bs[kk][0]);
            double2 u;
            u = ar[ty * 2];          a[0] = u.x; a[1] = u.y;
            u = ar[ty * 2 + 1];      a[2] = u.x; a[3] = u.y;
            u = ar[32 + ty * 2];     a[4] = u.x; a[5] = u.y;
            u = ar[32 + ty * 2 + 1]; a[6] = u.x; a[7] = u.y;
            u = br[tx * 2];          b[0] = u.x; b[1] = u.y;
            u = br[tx * 2 + 1];      b[2] = u.x; b[3] = u.y;
            u = br[32 + tx * 2];     b[4] = u.x; b[5] = u.y;
            u = br[32 + tx * 2 + 1]; b[6] = u.x; b[7] = u.y;
#pragma unroll
            for (int i = 0; i < 8; ++i)
#pragma unroll
                for (int j = 0; j < 8; ++j) acc[i][j] = fma(a[i], b[j], acc[i][j]);
        }
        __syncthreads();
    }

    // Epilogue: add the bias in double, round to float once, then ReLU.
    double bv[8];
#pragma unroll
    for (int h = 0; h < 2; ++h)
#pragma unroll
        for (int q = 0; q < 4; ++q) {
            const int64_t gn = n0 + 64 * h + tx * 4 + q;
            bv[4 * h + q] = gn < N ? (double)bias[gn] : 0.0;
        }
#pragma unroll
    for (int i = 0; i < 8; ++i) {
        const int64_t gm = m0 + (i < 4 ? ty * 4 + i : 64 + ty * 4 + (i - 4));
        if (gm >= M) continue;
#pragma unroll
        for (int h = 0; h < 2; ++h) {
            const int64_t gn = n0 + 64 * h + tx * 4;
            float* crow = C + gm * N;
            float o[4];
#pragma unroll
            for (int q = 0; q < 4; ++q) {
                const float v = (float)(acc[i][4 * h + q] + bv[4 * h + q]);
                o[q] = v < 0.f ? 0.f : v;  // NaN < 0 is false: NaN kept, like torch.relu
            }
            if (VEC) {
                if (gn < N)  // N % 4 == 0, so the whole float4 is inside
                    *reinterpret_cast<float4*>(crow + gn) = make_float4(o[0], o[1], o[2], o[3]);
            } else {
#pragma unroll
                for (int q = 0; q < 4; ++q)
                    if (gn + q < N) crow[gn + q] = o[q];
            }
        }
    }
}

static bool al16(const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; }

torch::Tensor gemm_bias_relu(torch::Tensor x, torch::Tensor weight, torch::Tensor bias) {
    TORCH_CHECK(x.is_cuda() && weight.is_cuda() && bias.is_cuda(), "gemm_bias_relu: CUDA tensors expected");
    TORCH_CHECK(x.scalar_type() == torch::kFloat32 && weight.scalar_type() == torch::kFloat32 &&
                bias.scalar_type() == torch::kFloat32, "gemm_bias_relu: float32 expected");
    TORCH_CHECK(x.dim() == 2 && weight.dim() == 2 && x.size(1) == weight.size(1),
                "gemm_bias_relu: x (M, K) and weight (N, K) expected");
    TORCH_CHECK(bias.numel() == weight.size(0), "gemm_bias_relu: bias must have N elements");
    x = x.contiguous();
    weight = weight.contiguous();
    bias = bias.contiguous();
    const int64_t M = x.size(0), K = x.size(1), N = weight.size(0);
    auto C = torch::empty({M, N}, x.options());
    if (M == 0 || N == 0) return C;
    const int64_t gx = (N + BN - 1) / BN, gy = (M + BM - 1) / BM;
    TORCH_CHECK(gx <= 0x7fffffffLL && gy <= 65535, "gemm_bias_relu: matrix too large for the grid");
    // K == 0: the loop body never runs and the epilogue writes relu(bias).
    const float* xp = x.data_ptr<float>();
    const float* wp = weight.data_ptr<float>();
    const float* bp = bias.data_ptr<float>();
    float* cp = C.data_ptr<float>();
    const bool vec = (K % 4 == 0) && (N % 4 == 0) && al16(xp) && al16(wp) && al16(cp);
    dim3 grid{(unsigned)gx, (unsigned)gy};
    dim3 block{(unsigned)kThreads};
    cudaStream_t stream = at::cuda::getCurrentCUDAStream();
    if (vec) gemm_bias_relu_kernel<true><<<grid, block, 0, stream>>>(xp, wp, bp, cp, M, N, K);
    else     gemm_bias_relu_kernel<false><<<grid, block, 0, stream>>>(xp, wp, bp, cp, M, N, K);
    cudaError_t err = cudaGetLastError();
    TORCH_CHECK(err == cudaSuccess, "gemm_bias_relu kernel launch failed: ", cudaGetErrorString(err));
    return C;
}
"""

cpp_source = "torch::Tensor gemm_bias_relu(torch::Tensor x, torch::Tensor weight, torch::Tensor bias);"

mod = load_inline(
    name="cutegen_hw_l2_p76_gemm_bias_relu",
    cpp_sources=cpp_source,
    cuda_sources=cuda_source,
    functions=["gemm_bias_relu"],
    extra_cuda_cflags=["-O3"],
    verbose=False,
)


class ModelNew(nn.Module):
    def __init__(self, in_features, out_features, bias_shape):
        super(ModelNew, self).__init__()
        # Created exactly as the task's Model creates them (same names, same order),
        # so the same seed gives bitwise-equal parameters.
        self.gemm = nn.Linear(in_features, out_features, bias=False)
        self.bias = nn.Parameter(torch.randn(bias_shape))

    def forward(self, x):
        return mod.gemm_bias_relu(x, self.gemm.weight, self.bias)
