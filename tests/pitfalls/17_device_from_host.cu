// Pitfall: A device function called from the launcher
// Expect: calling a __device__ function(
#include <cuda_runtime.h>
__device__ int tiles_for(int n) { return (n + 127) / 128; }
__global__ void k(float* x) { x[threadIdx.x] = 0.0f; }
extern "C" int run(float* x, int n, cudaStream_t stream) {
  k<<<tiles_for(n), 128, 0, stream>>>(x);  // a __device__ helper called in host code
  return cudaGetLastError();
}
