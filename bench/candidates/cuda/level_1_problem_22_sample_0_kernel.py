"""Hand-written honest plain-CUDA candidate in KernelBench format (not a model's output).

Task level1/22_Tanh: y = tanh(x), float32, any shape.

The kernel streams the tensor as float4 vectors (16-byte loads and stores) in a
grid-stride loop that keeps four independent vectors in flight per thread, with
64-bit indices because the task's tensor has 4096*393216 > 2^31 elements. The n
% 4 leftover elements are handled as scalars by the first threads, and a
pointer that is not 16-byte aligned (a view with an odd storage offset) takes
an all-scalar kernel. The op is tanhf (the accurate libdevice tanh, as PyTorch
uses); NaN propagates.
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

// libdevice tanhf is accurate to ~1 ulp, like the std::tanh PyTorch's kernel calls.
__device__ __forceinline__ float tanh_op(float v) { return tanhf(v); }

__device__ __forceinline__ float4 tanh_op4(float4 v) {
    return make_float4(tanh_op(v.x), tanh_op(v.y), tanh_op(v.z), tanh_op(v.w));
}

// Vector path: x and y are 16-byte aligned; nvec = n / 4 float4 vectors, and
// the last n % 4 elements (at most 3) are done as scalars by threads 0..2.
__global__ void __launch_bounds__(256)
tanh_vec4_kernel(const float4* __restrict__ x, float4* __restrict__ y, int64_t nvec,
                 const float* __restrict__ xs, float* __restrict__ ys, int64_t n) {
    const int64_t stride = (int64_t)gridDim.x * blockDim.x;
    int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    // Four independent 16-byte loads per iteration keep enough bytes in flight
    // per SM to approach HBM bandwidth; streaming hints because nothing is reused.
    for (; i + 3 * stride < nvec; i += 4 * stride) {
        float4 a = __ldcs(x + i);
        float4 b = __ldcs(x + i + stride);
        float4 c = __ldcs(x + i + 2 * stride);
        float4 d = __ldcs(x + i + 3 * stride);
        __stcs(y + i, tanh_op4(a));
        __stcs(y + i + stride, tanh_op4(b));
        __stcs(y + i + 2 * stride, tanh_op4(c));
        __stcs(y + i + 3 * stride, tanh_op4(d));
    }
    for (; i < nvec; i += stride) __stcs(y + i, tanh_op4(__ldcs(x + i)));

    const int64_t t = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    const int64_t tail = nvec * 4 + t;
    if (tail < n) ys[tail] = tanh_op(xs[tail]);
}

// Fallback when either pointer is not 16-byte aligned.
__global__ void __launch_bounds__(256)
tanh_scalar_kernel(const float* __restrict__ x, float* __restrict__ y, int64_t n) {
    const int64_t stride = (int64_t)gridDim.x * blockDim.x;
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += stride)
        y[i] = tanh_op(x[i]);
}

static int grid_cap() {
    // Enough resident blocks to fill every SM several times over; the grid-stride
    // loop covers the rest, so the grid never needs more than 32 blocks per SM.
    return at::cuda::getCurrentDeviceProperties()->multiProcessorCount * 32;
}

// Named tanh_act, not tanh: a global tanh(Tensor) would overload ::tanh(double)
// and make the generated pybind11 binding's function pointer ambiguous.
torch::Tensor tanh_act(torch::Tensor x) {
    TORCH_CHECK(x.is_cuda(), "tanh: x must be a CUDA tensor");
    TORCH_CHECK(x.scalar_type() == torch::kFloat32, "tanh: x must be float32");
    TORCH_CHECK(x.is_contiguous(), "tanh: x must be contiguous");
    auto y = torch::empty_like(x, x.options().memory_format(at::MemoryFormat::Contiguous));
    const int64_t n = x.numel();
    if (n == 0) return y;

    const float* xp = x.data_ptr<float>();
    float* yp = y.data_ptr<float>();
    cudaStream_t stream = at::cuda::getCurrentCUDAStream();
    const int threads = 256;
    const bool aligned = (reinterpret_cast<uintptr_t>(xp) % 16 == 0) &&
                         (reinterpret_cast<uintptr_t>(yp) % 16 == 0);
    if (aligned) {
        const int64_t nvec = n / 4;
        // At least one block so the (up to 3) tail elements are always covered.
        const int64_t want = std::max<int64_t>(1, (nvec + threads - 1) / threads);
        const unsigned blocks = (unsigned)std::min<int64_t>(want, grid_cap());
        dim3 grid{blocks};
        dim3 block{(unsigned)threads};
        tanh_vec4_kernel<<<grid, block, 0, stream>>>(
            reinterpret_cast<const float4*>(xp), reinterpret_cast<float4*>(yp), nvec, xp, yp, n);
    } else {
        const int64_t want = (n + threads - 1) / threads;
        const unsigned blocks = (unsigned)std::min<int64_t>(want, grid_cap());
        dim3 grid{blocks};
        dim3 block{(unsigned)threads};
        tanh_scalar_kernel<<<grid, block, 0, stream>>>(xp, yp, n);
    }
    cudaError_t err = cudaGetLastError();
    TORCH_CHECK(err == cudaSuccess, "tanh kernel launch failed: ", cudaGetErrorString(err));
    return y;
}
"""

cpp_source = "torch::Tensor tanh_act(torch::Tensor x);"

mod = load_inline(
    name="cutegen_hw_l1_p22_tanh",
    cpp_sources=cpp_source,
    cuda_sources=cuda_source,
    functions=["tanh_act"],
    extra_cuda_cflags=["-O3"],
    verbose=False,
)


class ModelNew(nn.Module):
    def __init__(self):
        super(ModelNew, self).__init__()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return mod.tanh_act(x.contiguous())
