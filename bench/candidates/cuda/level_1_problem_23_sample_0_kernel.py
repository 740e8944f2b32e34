"""Hand-written honest plain-CUDA candidate in KernelBench format (not a model's output).

Task level1/23_Softmax: y = softmax(x, dim=1) for a 2-D float32 tensor
(4096 x 393216 in the task).

One 1024-thread block per row and two passes over the row:
  1. an online (running max, rescaled sum) pass: each thread keeps m and
     s = sum exp(x - m) over its float4 slices, rescaling s only when m grows;
     the (m, s) pairs are merged across the block with warp shuffles;
  2. y = expf(x - m) * (1 / s), written as float4.
That is the max-subtracted softmax PyTorch computes, with accurate expf.  A NaN
in a row makes s NaN (expf(NaN) is added to it), so the whole row is NaN as in
PyTorch.  Rows whose length is not a multiple of 4, or a misaligned base
pointer, use the same kernel with scalar loads.  Offsets are 64-bit.
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

constexpr int kThreads = 1024;

// Merge two (max, sum-of-exp-relative-to-max) pairs.  A side whose max is
// still -inf has a sum of 0 (or NaN if it saw a NaN): it is added, never
// rescaled, which avoids exp(-inf - (-inf)) = NaN for rows of -inf.
__device__ __forceinline__ void merge(float& m, float& s, float m2, float s2) {
    if (m2 == -INFINITY) { s += s2; return; }
    if (m == -INFINITY) { m = m2; s += s2; return; }
    if (m2 > m) { s = s * expf(m - m2) + s2; m = m2; }
    else        { s = s + s2 * expf(m2 - m); }
}

// Fold one value into the running pair.  v > m is false for NaN, so NaN goes
// to the else branch and makes s NaN.  The new term exp(v - v) is 1, except for
// v = +inf where PyTorch's exp(inf - inf) = NaN turns the whole row NaN.
__device__ __forceinline__ void fold(float& m, float& s, float v) {
    if (v > m) {
        s = (m == -INFINITY ? s : s * expf(m - v)) + (v == INFINITY ? NAN : 1.f);
        m = v;
    }
    else if (m != -INFINITY)   { s += expf(v - m); }
    else if (v != v)           { s = NAN; }   // NaN before any finite value
    // else v == m == -inf: contributes exp(-inf) = 0
}

template <bool VEC>
__global__ void __launch_bounds__(kThreads)
softmax_rows_kernel(const float* __restrict__ x, float* __restrict__ y, int64_t cols) {
    const int64_t row = blockIdx.x;
    const float* xr = x + row * cols;
    float* yr = y + row * cols;
    const int tid = threadIdx.x;

    float m = -INFINITY, s = 0.f;
    if (VEC) {
        const int64_t nv = cols / 4;
        const float4* x4 = reinterpret_cast<const float4*>(xr);
        for (int64_t i = tid; i < nv; i += kThreads) {
            float4 v = x4[i];
            // One rescale per float4 instead of per element.
            float vm = fmaxf(fmaxf(v.x, v.y), fmaxf(v.z, v.w));
            if (vm > m) { s = (m == -INFINITY ? s : s * expf(m - vm)); m = vm; }
            if (m != -INFINITY)
                s += expf(v.x - m) + expf(v.y - m) + expf(v.z - m) + expf(v.w - m);
            else if (v.x != v.x || v.y != v.y || v.z != v.z || v.w != v.w)
                s = NAN;  // only -inf and NaN seen so far: keep the NaN
            // else all four are -inf: they contribute 0
        }
    } else {
        for (int64_t i = tid; i < cols; i += kThreads) fold(m, s, xr[i]);
    }
    // fmaxf ignores NaN, so for a NaN element m may stay as it is, but
    // expf(NaN - m) = NaN has been added to s: the row ends up NaN as in PyTorch.

    // Block reduction of (m, s): shuffles within warps, then warp 0 over warps.
    __shared__ float sm_m[kThreads / 32], sm_s[kThreads / 32];
    __shared__ float row_m, row_inv;
    for (int off = 16; off > 0; off >>= 1) {
        float m2 = __shfl_xor_sync(0xffffffffu, m, off);
        float s2 = __shfl_xor_sync(0xffffffffu, s, off);
        merge(m, s, m2, s2);
    }
    const int warp = tid >> 5, lane = tid & 31;
    if (lane == 0) { sm_m[warp] = m; sm_s[warp] = s; }
    __syncthreads();
    if (warp == 0) {
        m = lane < kThreads / 32 ? sm_m[lane] : -INFINITY;
        s = lane < kThreads / 32 ? sm_s[lane] : 0.f;
        for (int off = 16; off > 0; off >>= 1) {
            float m2 = __shfl_xor_sync(0xffffffffu, m, off);
            float s2 = __shfl_xor_sync(0xffffffffu, s, off);
            merge(m, s, m2, s2);
        }
        if (lane == 0) { row_m = m; row_inv = 1.0f / s; }
    }
    __syncthreads();
    const float M = row_m, inv = row_inv;

    if (VEC) {
        const int64_t nv = cols / 4;
        const float4* x4 = reinterpret_cast<const float4*>(xr);
        float4* y4 = reinterpret_cast<float4*>(yr);
        for (int64_t i = tid; i < nv; i += kThreads) {
            float4 v = x4[i];
            float4 o;
            o.x = expf(v.x - M) * inv;
            o.y = expf(v.y - M) * inv;
            o.z = expf(v.z - M) * inv;
            o.w = expf(v.w - M) * inv;
            __stcs(y4 + i, o);  // output is not re-read: stream it past L2
        }
    } else {
        for (int64_t i = tid; i < cols; i += kThreads) yr[i] = expf(xr[i] - M) * inv;
    }
}

torch::Tensor softmax_dim1(torch::Tensor x) {
    TORCH_CHECK(x.is_cuda(), "softmax_dim1: x must be a CUDA tensor");
    TORCH_CHECK(x.scalar_type() == torch::kFloat32, "softmax_dim1: x must be float32");
    TORCH_CHECK(x.dim() == 2, "softmax_dim1: x must be 2-D (rows, cols)");
    x = x.contiguous();
    auto y = torch::empty_like(x);
    const int64_t rows = x.size(0), cols = x.size(1);
    if (rows == 0 || cols == 0) return y;
    TORCH_CHECK(rows <= 0x7fffffffLL, "softmax_dim1: too many rows for a 1-D grid");

    const float* xp = x.data_ptr<float>();
    float* yp = y.data_ptr<float>();
    // Every row start is 16-byte aligned iff the base is and cols % 4 == 0.
    const bool vec = (cols % 4 == 0) && (reinterpret_cast<uintptr_t>(xp) % 16 == 0) &&
                     (reinterpret_cast<uintptr_t>(yp) % 16 == 0);
    cudaStream_t stream = at::cuda::getCurrentCUDAStream();
    dim3 grid{(unsigned)rows};
    dim3 block{(unsigned)kThreads};
    if (vec) softmax_rows_kernel<true><<<grid, block, 0, stream>>>(xp, yp, cols);
    else     softmax_rows_kernel<false><<<grid, block, 0, stream>>>(xp, yp, cols);
    cudaError_t err = cudaGetLastError();
    TORCH_CHECK(err == cudaSuccess, "softmax kernel launch failed: ", cudaGetErrorString(err));
    return y;
}
"""

cpp_source = "torch::Tensor softmax_dim1(torch::Tensor x);"

mod = load_inline(
    name="cutegen_hw_l1_p23_softmax",
    cpp_sources=cpp_source,
    cuda_sources=cuda_source,
    functions=["softmax_dim1"],
    extra_cuda_cflags=["-O3"],
    verbose=False,
)


class ModelNew(nn.Module):
    def __init__(self):
        super(ModelNew, self).__init__()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return mod.softmax_dim1(x)
