// Pitfall: Too much shared memory
// Expect: uses too much shared data
#include <cuda_runtime.h>
__global__ void k(float* y) {
  __shared__ float tile[64 * 1024];  // 256 KiB of static shared memory: more than an SM has
  tile[threadIdx.x] = float(threadIdx.x);
  __syncthreads();
  y[threadIdx.x] = tile[(threadIdx.x * 511) % (64 * 1024)];
}
extern "C" int run(float* y, cudaStream_t stream) { k<<<1, 128, 0, stream>>>(y); return cudaGetLastError(); }
