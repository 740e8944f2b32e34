"""Hand-written honest plain-CUDA candidate in KernelBench format (not a model's output).

Task level1/47_Sum_reduction_over_a_dimension: y = torch.sum(x, dim, keepdim=True)
for float32 x (128 x 4096 x 4095 reduced over dim 1 in the task).

x is viewed as (outer, R, inner) around the reduced dim.
  * inner > 1 (the task): a 32 x 8 block owns 32 consecutive inner indices of
    one outer slice; each warp reads 32 consecutive floats of one r-row
    (coalesced, inner = 4095 is odd so no float4 here), the 8 warps split R,
    each thread sums every 8th row with 4 independent loads in flight, and the
    8 partial sums are combined through shared memory.
  * inner == 1 (reducing the last dim): one block per output reads the row
    with stride-blockDim access and reduces with shuffles.
Sums are accumulated in double and rounded once, so the result is the
correctly rounded sum up to double error, never farther from the exact value
than PyTorch's float accumulation.  NaN/inf propagate through the additions.
Offsets are 64-bit.
"""
import torch
import torch.nn as nn
from torch.utils.cpp_extension import load_inline

cuda_source = r"""
#include <torch/extension.h>
#include <ATen/cuda/CUDAContext.h>
#include <cuda_runtime.h>
#include <cstdint>

constexpr int kTX = 32, kTY = 8;

// grid.x = outer * ceil(inner / 32) tiles; block {32, 8}.
__global__ void __launch_bounds__(kTX * kTY)
sum_mid_kernel(const float* __restrict__ x, float* __restrict__ y,
               int64_t R, int64_t inner, int64_t tiles_per_outer) {
    __shared__ double part[kTY][kTX + 1];
    const int64_t tile = blockIdx.x;
    const int64_t o = tile / tiles_per_outer;
    const int64_t i = (tile - o * tiles_per_outer) * kTX + threadIdx.x;
    double acc = 0.0;
    if (i < inner) {
        const float* p = x + o * R * inner + i;
        int64_t r = threadIdx.y;
        // Four independent loads per step; separate accumulators shorten the
        // dependent double-add chain.
        double a0 = 0.0, a1 = 0.0, a2 = 0.0, a3 = 0.0;
        for (; r + 3 * kTY < R; r += 4 * kTY) {
            const float v0 = __ldcs(p + r * inner);
            const float v1 = __ldcs(p + (r + kTY) * inner);
            const float v2 = __ldcs(p + (r + 2 * kTY) * inner);
            const float v3 = __ldcs(p + (r + 3 * kTY) * inner);
            a0 += v0; a1 += v1; a2 += v2; a3 += v3;
        }
        for (; r < R; r += kTY) a0 += __ldcs(p + r * inner);
        acc = (a0 + a1) + (a2 + a3);
    }
    part[threadIdx.y][threadIdx.x] = acc;
    __syncthreads();
    if (threadIdx.y == 0 && i < inner) {
        double t = 0.0;
#pragma unroll
        for (int k = 0; k < kTY; ++k) t += part[k][threadIdx.x];
        y[o * inner + i] = (float)t;
    }
}

// inner == 1: grid.x = outer (rows), one block of 256 per row.
__global__ void __launch_bounds__(256)
sum_last_kernel(const float* __restrict__ x, float* __restrict__ y, int64_t R) {
    __shared__ double sh[8];
    const float* p = x + (int64_t)blockIdx.x * R;
    double acc = 0.0;
    for (int64_t r = threadIdx.x; r < R; r += 256) acc += p[r];
    for (int off = 16; off > 0; off >>= 1) acc += __shfl_xor_sync(0xffffffffu, acc, off);
    if ((threadIdx.x & 31) == 0) sh[threadIdx.x >> 5] = acc;
    __syncthreads();
    if (threadIdx.x == 0) {
        double t = 0.0;
        for (int k = 0; k < 8; ++k) t += sh[k];
        y[blockIdx.x] = (float)t;
    }
}

torch::Tensor sum_dim_keepdim(torch::Tensor x, int64_t dim) {
    TORCH_CHECK(x.is_cuda(), "sum_dim_keepdim: x must be a CUDA tensor");
    TORCH_CHECK(x.scalar_type() == torch::kFloat32, "sum_dim_keepdim: x must be float32");
    TORCH_CHECK(x.dim() >= 1, "sum_dim_keepdim: x must have a dim to reduce");
    const int64_t nd = x.dim();
    if (dim < 0) dim += nd;
    TORCH_CHECK(dim >= 0 && dim < nd, "sum_dim_keepdim: dim out of range");
    x = x.contiguous();
    int64_t outer = 1, inner = 1;
    for (int64_t d = 0; d < dim; ++d) outer *= x.size(d);
    for (int64_t d = dim + 1; d < nd; ++d) inner *= x.size(d);
    const int64_t R = x.size(dim);
    auto sizes = x.sizes().vec();
    sizes[dim] = 1;
    auto y = torch::empty(sizes, x.options());
    if (y.numel() == 0) return y;
    // R == 0 needs no special case: the kernels then write 0, the empty sum.

    cudaStream_t stream = at::cuda::getCurrentCUDAStream();
    const float* xp = x.data_ptr<float>();
    float* yp = y.data_ptr<float>();
    if (inner > 1) {
        const int64_t tpo = (inner + kTX - 1) / kTX;
        const int64_t tiles = outer * tpo;
        TORCH_CHECK(tiles <= 0x7fffffffLL, "sum_dim_keepdim: grid too large");
        dim3 grid{(unsigned)tiles};
        dim3 block{(unsigned)kTX, (unsigned)kTY};
        sum_mid_kernel<<<grid, block, 0, stream>>>(xp, yp, R, inner, tpo);
    } else {
        TORCH_CHECK(outer <= 0x7fffffffLL, "sum_dim_keepdim: grid too large");
        dim3 grid{(unsigned)outer};
        dim3 block{256u};
        sum_last_kernel<<<grid, block, 0, stream>>>(xp, yp, R);
    }
    cudaError_t err = cudaGetLastError();
    TORCH_CHECK(err == cudaSuccess, "sum kernel launch failed: ", cudaGetErrorString(err));
    return y;
}
"""

cpp_source = "torch::Tensor sum_dim_keepdim(torch::Tensor x, int64_t dim);"

mod = load_inline(
    name="cutegen_hw_l1_p47_sum_dim",
    cpp_sources=cpp_source,
    cuda_sources=cuda_source,
    functions=["sum_dim_keepdim"],
    extra_cuda_cflags=["-O3"],
    verbose=False,
)


class ModelNew(nn.Module):
    def __init__(self, dim: int):
        super(ModelNew, self).__init__()
        self.dim = dim

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return mod.sum_dim_keepdim(x, self.dim)
