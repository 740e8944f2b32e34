// Pitfall: Implicit float to bf16
// Expect: no suitable constructor exists to convert from "float" to "cutlass::bfloat16_t"
#include <cute/tensor.hpp>
using namespace cute;
__global__ void k(cutlass::bfloat16_t* y, float const* x) {
  cutlass::bfloat16_t v = x[threadIdx.x] * 2.0f;  // float -> bf16 needs an explicit conversion
  y[threadIdx.x] = v;
}
extern "C" int run(cutlass::bfloat16_t* y, float const* x, cudaStream_t stream) { k<<<1, 32, 0, stream>>>(y, x); return cudaGetLastError(); }
