"""Hand-written honest plain-CUDA candidate in KernelBench format (not a model's output).

Task level1/49_Max_reduction_over_a_dimension: y = torch.max(x, dim)[0]
(values only, the dim removed) for float32 x (128 x 4096 x 4095 over dim 1).

x is viewed as (outer, R, inner) around the reduced dim.
  * inner > 1 (the task): a 32 x 8 block owns 32 consecutive inner indices of
    one outer slice; each warp reads 32 consecutive floats of one r-row
    (coalesced; inner = 4095 is odd so no float4), the 8 warps split R with 4
    independent loads in flight per thread, and the 8 partial maxima are
    combined through shared memory.
  * inner == 1 (reducing the last dim): one block per output, shuffle reduce.
NaN handling matches torch.max: the combine step takes the new value when it
is greater or when it is NaN, and a NaN once taken is never replaced (every
comparison with it is false), so any NaN in the slice gives NaN.  Max is exact,
so the values equal PyTorch's bit for bit.  Offsets are 64-bit.
"""
import torch
import torch.nn as nn
from torch.utils.cpp_extension import load_inline

cuda_source = r"""
#include <torch/extension.h>
#include <ATen/cuda/CUDAContext.h>
#include <cuda_runtime.h>
#include <cstdint>
#include <cmath>

constexpr int kTX = 32, kTY = 8;

// NaN-propagating max: keeps a NaN in m, takes v if v is NaN or larger.
__device__ __forceinline__ float nanmax(float m, float v) { return (v > m || v != v) ? v : m; }

// grid.x = outer * ceil(inner / 32) tiles; block {32, 8}.
__global__ void __launch_bounds__(kTX * kTY)
max_mid_kernel(const float* __restrict__ x, float* __restrict__ y,
               int64_t R, int64_t inner, int64_t tiles_per_outer) {
    __shared__ float part[kTY][kTX + 1];
    const int64_t tile = blockIdx.x;
    const int64_t o = tile / tiles_per_outer;
    const int64_t i = (tile - o * tiles_per_outer) * kTX + threadIdx.x;
    float acc = -INFINITY;
    if (i < inner) {
        const float* p = x + o * R * inner + i;
        int64_t r = threadIdx.y;
        float a0 = -INFINITY, a1 = -INFINITY, a2 = -INFINITY, a3 = -INFINITY;
        for (; r + 3 * kTY < R; r += 4 * kTY) {
            a0 = nanmax(a0, __ldcs(p + r * inner));
            a1 = nanmax(a1, __ldcs(p + (r + kTY) * inner));
            a2 = nanmax(a2, __ldcs(p + (r + 2 * kTY) * inner));
            a3 = nanmax(a3, __ldcs(p + (r + 3 * kTY) * inner));
        }
        for (; r < R; r += kTY) a0 = nanmax(a0, __ldcs(p + r * inner));
        acc = nanmax(nanmax(a0, a1), nanmax(a2, a3));
    }
    part[threadIdx.y][threadIdx.x] = acc;
    __syncthreads();
    if (threadIdx.y == 0 && i < inner) {
        float t = part[0][threadIdx.x];
#pragma unroll
        for (int k = 1; k < kTY; ++k) t = nanmax(t, part[k][threadIdx.x]);
        y[o * inner + i] = t;
    }
}

// inner == 1: grid.x = outer (rows), one block of 256 per row.
__global__ void __launch_bounds__(256)
max_last_kernel(const float* __restrict__ x, float* __restrict__ y, int64_t R) {
    __shared__ float sh[8];
    const float* p = x + (int64_t)blockIdx.x * R;
    float acc = -INFINITY;
    for (int64_t r = threadIdx.x; r < R; r += 256) acc = nanmax(acc, p[r]);
    for (int off = 16; off > 0; off >>= 1) acc = nanmax(acc, __shfl_xor_sync(0xffffffffu, acc, off));
    if ((threadIdx.x & 31) == 0) sh[threadIdx.x >> 5] = acc;
    __syncthreads();
    if (threadIdx.x == 0) {
        float t = sh[0];
        for (int k = 1; k < 8; ++k) t = nanmax(t, sh[k]);
        y[blockIdx.x] = t;
    }
}

torch::Tensor max_dim_values(torch::Tensor x, int64_t dim) {
    TORCH_CHECK(x.is_cuda(), "max_dim_values: x must be a CUDA tensor");
    TORCH_CHECK(x.scalar_type() == torch::kFloat32, "max_dim_values: x must be float32");
    TORCH_CHECK(x.dim() >= 1, "max_dim_values: x must have a dim to reduce");
    const int64_t nd = x.dim();
    if (dim < 0) dim += nd;
    TORCH_CHECK(dim >= 0 && dim < nd, "max_dim_values: dim out of range");
    const int64_t R = x.size(dim);
    TORCH_CHECK(R > 0, "max_dim_values: cannot reduce an empty dim (as torch.max)");
    x = x.contiguous();
    int64_t outer = 1, inner = 1;
    for (int64_t d = 0; d < dim; ++d) outer *= x.size(d);
    for (int64_t d = dim + 1; d < nd; ++d) inner *= x.size(d);
    auto sizes = x.sizes().vec();
    sizes.erase(sizes.begin() + dim);  // keepdim=False
    auto y = torch::empty(sizes, x.options());
    if (y.numel() == 0) return y;

    cudaStream_t stream = at::cuda::getCurrentCUDAStream();
    const float* xp = x.data_ptr<float>();
    float* yp = y.data_ptr<float>();
    if (inner > 1) {
        const int64_t tpo = (inner + kTX - 1) / kTX;
        const int64_t tiles = outer * tpo;
        TORCH_CHECK(tiles <= 0x7fffffffLL, "max_dim_values: grid too large");
        dim3 grid{(unsigned)tiles};
        dim3 block{(unsigned)kTX, (unsigned)kTY};
        max_mid_kernel<<<grid, block, 0, stream>>>(xp, yp, R, inner, tpo);
    } else {
        TORCH_CHECK(outer <= 0x7fffffffLL, "max_dim_values: grid too large");
        dim3 grid{(unsigned)outer};
        dim3 block{256u};
        max_last_kernel<<<grid, block, 0, stream>>>(xp, yp, R);
    }
    cudaError_t err = cudaGetLastError();
    TORCH_CHECK(err == cudaSuccess, "max kernel launch failed: ", cudaGetErrorString(err));
    return y;
}
"""

cpp_source = "torch::Tensor max_dim_values(torch::Tensor x, int64_t dim);"

mod = load_inline(
    name="cutegen_hw_l1_p49_max_dim",
    cpp_sources=cpp_source,
    cuda_sources=cuda_source,
    functions=["max_dim_values"],
    extra_cuda_cflags=["-O3"],
    verbose=False,
)


class ModelNew(nn.Module):
    def __init__(self, dim: int):
        super(ModelNew, self).__init__()
        self.dim = dim

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return mod.max_dim_values(x, self.dim)
