// Pitfall: A runtime value where a compile-time one is needed
// Expect: expression must have a constant value
#include <cute/tensor.hpp>
using namespace cute;
__global__ void k(float* y, int pending) {
  cp_async_wait<pending>();  // the number of groups to wait for is a template argument
  y[threadIdx.x] = 0.0f;
}
extern "C" int run(float* y, int pending, cudaStream_t stream) { k<<<1, 32, 0, stream>>>(y, pending); return cudaGetLastError(); }
