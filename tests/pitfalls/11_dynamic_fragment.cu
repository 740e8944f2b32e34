// Pitfall: A register tensor with a runtime size
// Expect: Dynamic owning tensors not supported
#include <cute/tensor.hpp>
using namespace cute;
__global__ void k(float* x, int n) {
  Tensor rX = make_tensor<float>(make_shape(n));  // registers need a compile-time size
  rX(0) = 1.0f;
  x[threadIdx.x] = rX(0);
}
extern "C" int run(float* x, int n, cudaStream_t stream) { k<<<1, 32, 0, stream>>>(x, n); return cudaGetLastError(); }
