// Pitfall: A host function called from a kernel
// Expect: calling a __host__ function(
#include <cuda_runtime.h>
float scale_of(int i) { return 0.5f * i; }  // a host function (no __device__)
__global__ void k(float* y) { y[threadIdx.x] = scale_of(threadIdx.x); }
extern "C" int run(float* y, cudaStream_t stream) { k<<<1, 32, 0, stream>>>(y); return cudaGetLastError(); }
