// Pitfall: Device lambdas in host code
// Expect: __host__ or __device__ annotation on lambda requires --extended-lambda nvcc flag
#include <cuda_runtime.h>
template <class Op>
__global__ void apply(float* y, Op op) { y[threadIdx.x] = op(y[threadIdx.x]); }
extern "C" int run(float* y, cudaStream_t stream) {
  auto twice = [] __device__ (float v) { return 2.0f * v; };  // needs --extended-lambda
  apply<<<1, 32, 0, stream>>>(y, twice);
  return cudaGetLastError();
}
