"""Hand-written honest plain-CUDA candidate in KernelBench format (not a model's output).

Task level1/40_LayerNorm: y = nn.LayerNorm(normalized_shape)(x) over the last
len(normalized_shape) dims (16 rows of 64*256*256 = 4 Mi elements in the task),
with the module's own weight and bias (read in forward) and eps = 1e-5.

A row has millions of elements but there are only 16 rows, so one block per row
would leave most SMs idle.  Three kernels instead:
  1. partial sums: the row is cut into chunks of 16 Ki elements; each block sums
     x and x^2 over one chunk in double (float4 loads) and writes the pair;
  2. stats: one block per row adds its chunks' pairs in double and computes
     mean and rstd = 1 / sqrt(var + eps) with the biased variance (double
     E[x^2] - mean^2 keeps full float accuracy even for heavy-tailed rows);
  3. apply: y = (x - mean) * rstd * w + b over the whole tensor in float4,
     grid (chunks per row, rows) so no 64-bit division is needed per element.
Rows whose length is not a multiple of 4 (or misaligned pointers) take the
scalar versions of kernels 1 and 3.  Offsets are 64-bit.
"""
import torch
import torch.nn as nn
from torch.utils.cpp_extension import load_inline

cuda_source = r"""
#include <torch/extension.h>
#include <ATen/cuda/CUDAContext.h>
#include <cuda_runtime.h>
#include <algorithm>
#include <cstdint>

constexpr int kThreads = 256;
constexpr int64_t kChunk = 16384;  // elements per partial-sum block (multiple of 4)

__device__ __forceinline__ void block_sum2(double& a, double& b, double* sh /* 2 * 32 */) {
    for (int off = 16; off > 0; off >>= 1) {
        a += __shfl_xor_sync(0xffffffffu, a, off);
        b += __shfl_xor_sync(0xffffffffu, b, off);
    }
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const int nwarps = blockDim.x >> 5;
    if (lane == 0) { sh[warp] = a; sh[32 + warp] = b; }
    __syncthreads();
    if (warp == 0) {
        a = lane < nwarps ? sh[lane] : 0.0;
        b = lane < nwarps ? sh[32 + lane] : 0.0;
        for (int off = 16; off > 0; off >>= 1) {
            a += __shfl_xor_sync(0xffffffffu, a, off);
            b += __shfl_xor_sync(0xffffffffu, b, off);
        }
    }
}

// Kernel 1: grid {chunks, rows}; writes partial[row * chunks + chunk] = (sum x, sum x^2).
template <bool VEC>
__global__ void __launch_bounds__(kThreads)
ln_partial_kernel(const float* __restrict__ x, double2* __restrict__ partial,
                  int64_t D, int chunks) {
    __shared__ double sh[64];
    const int64_t row = blockIdx.y;
    const int64_t start = (int64_t)blockIdx.x * kChunk;
    const int64_t end = min(start + kChunk, D);
    const float* xr = x + row * D;
    double s = 0.0, q = 0.0;
    if (VEC) {
        const float4* x4 = reinterpret_cast<const float4*>(xr);
        for (int64_t i = start / 4 + threadIdx.x; i < end / 4; i += kThreads) {
            const float4 v = x4[i];
            s += ((double)v.x + (double)v.y) + ((double)v.z + (double)v.w);
            q = fma((double)v.x, (double)v.x, q);
            q = fma((double)v.y, (double)v.y, q);
            q = fma((double)v.z, (double)v.z, q);
            q = fma((double)v.w, (double)v.w, q);
        }
    } else {
        for (int64_t i = start + threadIdx.x; i < end; i += kThreads) {
            const double v = xr[i];
            s += v;
            q = fma(v, v, q);
        }
    }
    block_sum2(s, q, sh);
    if (threadIdx.x == 0) partial[row * chunks + blockIdx.x] = make_double2(s, q);
}

// Kernel 2: grid {rows}; mean and rstd per row.
__global__ void __launch_bounds__(kThreads)
ln_stats_kernel(const double2* __restrict__ partial, float2* __restrict__ stats,
                int64_t D, int chunks, double eps) {
    __shared__ double sh[64];
    const int64_t row = blockIdx.x;
    double s = 0.0, q = 0.0;
    for (int c = threadIdx.x; c < chunks; c += kThreads) {
        const double2 p = partial[row * chunks + c];
        s += p.x;
        q += p.y;
    }
    block_sum2(s, q, sh);
    if (threadIdx.x == 0) {
        const double mean = s / (double)D;
        const double var = fmax(q / (double)D - mean * mean, 0.0);  // biased, as LayerNorm
        stats[row] = make_float2((float)mean, (float)(1.0 / sqrt(var + eps)));
    }
}

// Kernel 3: grid {ceil(D / (4 * kThreads * per)), min(rows, 65535)}; rows strided by gridDim.y.
template <bool VEC>
__global__ void __launch_bounds__(kThreads)
ln_apply_kernel(const float* __restrict__ x, const float* __restrict__ w,
                const float* __restrict__ b, const float2* __restrict__ stats,
                float* __restrict__ y, int64_t rows, int64_t D) {
    const int64_t stride = (int64_t)gridDim.x * kThreads;
    for (int64_t row = blockIdx.y; row < rows; row += gridDim.y) {
        const float2 st = stats[row];
        const float mean = st.x, rstd = st.y;
        const float* xr = x + row * D;
        float* yr = y + row * D;
        if (VEC) {
            const float4* x4 = reinterpret_cast<const float4*>(xr);
            const float4* w4 = reinterpret_cast<const float4*>(w);
            const float4* b4 = reinterpret_cast<const float4*>(b);
            float4* y4 = reinterpret_cast<float4*>(yr);
            for (int64_t i = (int64_t)blockIdx.x * kThreads + threadIdx.x; i < D / 4; i += stride) {
                const float4 v = __ldcs(x4 + i);
                const float4 g = w4[i];   // weight/bias are reused by every row: keep cached
                const float4 h = b4[i];
                float4 o;
                o.x = (v.x - mean) * rstd * g.x + h.x;
                o.y = (v.y - mean) * rstd * g.y + h.y;
                o.z = (v.z - mean) * rstd * g.z + h.z;
                o.w = (v.w - mean) * rstd * g.w + h.w;
                __stcs(y4 + i, o);
            }
        } else {
            for (int64_t i = (int64_t)blockIdx.x * kThreads + threadIdx.x; i < D; i += stride)
                yr[i] = (xr[i] - mean) * rstd * w[i] + b[i];
        }
    }
}

static bool al16(const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; }

torch::Tensor layernorm_fwd(torch::Tensor x, torch::Tensor weight, torch::Tensor bias,
                            int64_t norm_ndim, double eps) {
    TORCH_CHECK(x.is_cuda() && weight.is_cuda() && bias.is_cuda(), "layernorm_fwd: CUDA tensors expected");
    TORCH_CHECK(x.scalar_type() == torch::kFloat32 && weight.scalar_type() == torch::kFloat32 &&
                bias.scalar_type() == torch::kFloat32, "layernorm_fwd: float32 expected");
    TORCH_CHECK(norm_ndim >= 1 && norm_ndim <= x.dim(), "layernorm_fwd: bad normalized ndim");
    x = x.contiguous();
    weight = weight.contiguous();
    bias = bias.contiguous();
    int64_t D = 1;
    for (int64_t d = x.dim() - norm_ndim; d < x.dim(); ++d) D *= x.size(d);
    TORCH_CHECK(weight.numel() == D && bias.numel() == D, "layernorm_fwd: weight/bias size mismatch");
    auto y = torch::empty_like(x);
    if (x.numel() == 0) return y;
    const int64_t rows = x.numel() / D;

    const float* xp = x.data_ptr<float>();
    const float* wp = weight.data_ptr<float>();
    const float* bp = bias.data_ptr<float>();
    float* yp = y.data_ptr<float>();
    const bool vec = (D % 4 == 0) && al16(xp) && al16(wp) && al16(bp) && al16(yp);

    const int64_t chunks64 = (D + kChunk - 1) / kChunk;
    TORCH_CHECK(chunks64 <= 0x7fffffffLL, "layernorm_fwd: row too long");
    const int chunks = (int)chunks64;
    auto partial = torch::empty({rows * chunks * 2}, x.options().dtype(torch::kFloat64));
    auto stats = torch::empty({rows * 2}, x.options());
    double2* pp = reinterpret_cast<double2*>(partial.data_ptr<double>());
    float2* sp = reinterpret_cast<float2*>(stats.data_ptr<float>());
    cudaStream_t stream = at::cuda::getCurrentCUDAStream();
    const unsigned gy = (unsigned)std::min<int64_t>(rows, 65535);
    dim3 block{(unsigned)kThreads};

    // Kernel 1 needs one block per (chunk, row): loop over row slabs of <= 65535.
    for (int64_t r0 = 0; r0 < rows; r0 += 65535) {
        const unsigned nr = (unsigned)std::min<int64_t>(rows - r0, 65535);
        dim3 grid1{(unsigned)chunks, nr};
        if (vec) ln_partial_kernel<true><<<grid1, block, 0, stream>>>(xp + r0 * D, pp + r0 * chunks, D, chunks);
        else     ln_partial_kernel<false><<<grid1, block, 0, stream>>>(xp + r0 * D, pp + r0 * chunks, D, chunks);
    }
    cudaError_t err = cudaGetLastError();
    TORCH_CHECK(err == cudaSuccess, "ln_partial launch failed: ", cudaGetErrorString(err));

    TORCH_CHECK(rows <= 0x7fffffffLL, "layernorm_fwd: too many rows");
    dim3 grid2{(unsigned)rows};
    ln_stats_kernel<<<grid2, block, 0, stream>>>(pp, sp, D, chunks, eps);
    err = cudaGetLastError();
    TORCH_CHECK(err == cudaSuccess, "ln_stats launch failed: ", cudaGetErrorString(err));

    // Apply: each block covers 4 * kThreads elements per step (vector path); aim for
    // ~16 steps per block and at least a few thousand blocks overall.
    const int64_t per_block = (vec ? 4 : 1) * (int64_t)kThreads * 16;
    const int64_t gx = std::max<int64_t>(1, std::min<int64_t>((D + per_block - 1) / per_block, 65535));
    dim3 grid3{(unsigned)gx, gy};
    if (vec) ln_apply_kernel<true><<<grid3, block, 0, stream>>>(xp, wp, bp, sp, yp, rows, D);
    else     ln_apply_kernel<false><<<grid3, block, 0, stream>>>(xp, wp, bp, sp, yp, rows, D);
    err = cudaGetLastError();
    TORCH_CHECK(err == cudaSuccess, "ln_apply launch failed: ", cudaGetErrorString(err));
    return y;
}
"""

cpp_source = ("torch::Tensor layernorm_fwd(torch::Tensor x, torch::Tensor weight, torch::Tensor bias, "
              "int64_t norm_ndim, double eps);")

mod = load_inline(
    name="cutegen_hw_l1_p40_layernorm",
    cpp_sources=cpp_source,
    cuda_sources=cuda_source,
    functions=["layernorm_fwd"],
    extra_cuda_cflags=["-O3"],
    verbose=False,
)


class ModelNew(nn.Module):
    def __init__(self, normalized_shape: tuple):
        super(ModelNew, self).__init__()
        # Same module as the task's Model, so weight/bias are created identically.
        self.ln = nn.LayerNorm(normalized_shape=normalized_shape)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return mod.layernorm_fwd(x, self.ln.weight, self.ln.bias,
                                 len(self.ln.normalized_shape), self.ln.eps)
