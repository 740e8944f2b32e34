// Pitfall: CuTe header not included
// Expect: name must be a namespace name
#include <cuda_runtime.h>
using namespace cute;  // <cute/tensor.hpp> was never included
__global__ void k(float* x) { x[threadIdx.x] = 0.0f; }
extern "C" int run(float* x, cudaStream_t stream) { k<<<1, 32, 0, stream>>>(x); return cudaGetLastError(); }
