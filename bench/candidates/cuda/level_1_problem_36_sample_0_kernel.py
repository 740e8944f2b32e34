"""Hand-written honest plain-CUDA candidate in KernelBench format (not a model's output).

Task level1/36_RMSNorm_: y = x / sqrt(mean(x^2, dim=1, keepdim=True) + eps) for
x of shape (B, C, *) (112 x 64 x 512 x 512 in the task), float32.

The reduction runs over the channel dim, whose elements are S = prod(dims 2..)
apart.  One thread owns one (b, s) position: a warp reads 32 consecutive s of
one channel plane (coalesced 128-byte lines) and walks the C planes.  For
C <= 64 the thread keeps its C values in registers (unrolled, constant
indices), so x is read from HBM once; the sum of squares is accumulated in
double (exact enough that only the final roundings differ from PyTorch), then
rms = sqrtf((float)mean + eps) and y = x / rms with a true division, the same
float operations PyTorch performs.  Larger C falls back to a two-pass loop
that re-reads x.  All offsets are 64-bit (B*C*S is near 2^31 here).
"""
import torch
import torch.nn as nn
from torch.utils.cpp_extension import load_inline

cuda_source = r"""
#include <torch/extension.h>
#include <ATen/cuda/CUDAContext.h>
#include <cuda_runtime.h>
#include <cstdint>

constexpr int kThreads = 256;

// C <= CMAX: each thread caches its column of C values in registers.  The
// loops are fully unrolled with compile-time indices so v[] stays in registers;
// the c < C guards cost one predicate each.
template <int CMAX>
__global__ void __launch_bounds__(kThreads)
rmsnorm_cached_kernel(const float* __restrict__ x, float* __restrict__ y,
                      int64_t B, int C, int64_t S, float eps) {
    const int64_t p = (int64_t)blockIdx.x * kThreads + threadIdx.x;  // (b, s) position
    if (p >= B * S) return;
    const int64_t b = p / S, s = p - b * S;
    const int64_t base = b * (int64_t)C * S + s;

    float v[CMAX];
    double ss = 0.0;
#pragma unroll
    for (int c = 0; c < CMAX; ++c) {
        if (c < C) {
            v[c] = __ldcs(x + base + (int64_t)c * S);  // read once, never again
            ss = fma((double)v[c], (double)v[c], ss);
        }
    }
    // PyTorch: mean (float) + eps (float), sqrt, then x / rms.
    const float mean = (float)(ss / (double)C);
    const float rms = sqrtf(mean + eps);
#pragma unroll
    for (int c = 0; c < CMAX; ++c)
        if (c < C) __stcs(y + base + (int64_t)c * S, v[c] / rms);
}

// Any C: first pass accumulates, second pass re-reads x and writes y.
__global__ void __launch_bounds__(kThreads)
rmsnorm_twopass_kernel(const float* __restrict__ x, float* __restrict__ y,
                       int64_t B, int C, int64_t S, float eps) {
    const int64_t p = (int64_t)blockIdx.x * kThreads + threadIdx.x;
    if (p >= B * S) return;
    const int64_t b = p / S, s = p - b * S;
    const int64_t base = b * (int64_t)C * S + s;
    double ss = 0.0;
    for (int c = 0; c < C; ++c) {
        const double v = x[base + (int64_t)c * S];
        ss = fma(v, v, ss);
    }
    const float mean = (float)(ss / (double)C);
    const float rms = sqrtf(mean + eps);
    for (int c = 0; c < C; ++c) y[base + (int64_t)c * S] = x[base + (int64_t)c * S] / rms;
}

torch::Tensor rmsnorm_dim1(torch::Tensor x, double eps) {
    TORCH_CHECK(x.is_cuda(), "rmsnorm_dim1: x must be a CUDA tensor");
    TORCH_CHECK(x.scalar_type() == torch::kFloat32, "rmsnorm_dim1: x must be float32");
    TORCH_CHECK(x.dim() >= 2, "rmsnorm_dim1: x must be (B, C, ...)");
    x = x.contiguous();
    auto y = torch::empty_like(x);
    const int64_t B = x.size(0);
    const int64_t C64 = x.size(1);
    TORCH_CHECK(C64 <= 0x7fffffffLL, "rmsnorm_dim1: too many channels");
    const int C = (int)C64;
    int64_t S = 1;
    for (int d = 2; d < x.dim(); ++d) S *= x.size(d);
    if (x.numel() == 0) return y;

    const int64_t positions = B * S;
    const int64_t blocks = (positions + kThreads - 1) / kThreads;
    TORCH_CHECK(blocks <= 0x7fffffffLL, "rmsnorm_dim1: grid too large");
    dim3 grid{(unsigned)blocks};
    dim3 block{(unsigned)kThreads};
    cudaStream_t stream = at::cuda::getCurrentCUDAStream();
    const float* xp = x.data_ptr<float>();
    float* yp = y.data_ptr<float>();
    const float feps = (float)eps;  // PyTorch adds the Python float as a float32 scalar
    if (C <= 16)
        rmsnorm_cached_kernel<16><<<grid, block, 0, stream>>>(xp, yp, B, C, S, feps);
    else if (C <= 64)
        rmsnorm_cached_kernel<64><<<grid, block, 0, stream>>>(xp, yp, B, C, S, feps);
    else
        rmsnorm_twopass_kernel<<<grid, block, 0, stream>>>(xp, yp, B, C, S, feps);
    cudaError_t err = cudaGetLastError();
    TORCH_CHECK(err == cudaSuccess, "rmsnorm kernel launch failed: ", cudaGetErrorString(err));
    return y;
}
"""

cpp_source = "torch::Tensor rmsnorm_dim1(torch::Tensor x, double eps);"

mod = load_inline(
    name="cutegen_hw_l1_p36_rmsnorm",
    cpp_sources=cpp_source,
    cuda_sources=cuda_source,
    functions=["rmsnorm_dim1"],
    extra_cuda_cflags=["-O3"],
    verbose=False,
)


class ModelNew(nn.Module):
    def __init__(self, num_features: int, eps: float = 1e-5):
        super(ModelNew, self).__init__()
        self.num_features = num_features
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return mod.rmsnorm_dim1(x, self.eps)
