// Pitfall: Most vexing parse of a dim3
// Expect: no suitable constructor exists to convert from "dim3 (
#include <cstdint>
#include <cuda_runtime.h>
__global__ void fill_kernel(float* y) { y[blockIdx.y * gridDim.x + blockIdx.x] = 1.0f; }
extern "C" int fill(float* y, int64_t rows, int64_t cols, cudaStream_t stream) {
  dim3 grid(unsigned(cols), unsigned(rows));  // declares a function, not a dim3
  fill_kernel<<<grid, 1, 0, stream>>>(y);
  return cudaGetLastError();
}
