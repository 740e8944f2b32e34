// Pitfall: Tensor without the cute namespace
// Expect: identifier "Tensor" is undefined
#include <cute/tensor.hpp>
__global__ void k(float* x, int n) {
  Tensor mX = cute::make_tensor(cute::make_gmem_ptr(x), cute::make_shape(n));  // Tensor is cute::Tensor
  if (int(threadIdx.x) < n) mX(threadIdx.x) = 0.0f;
}
extern "C" int run(float* x, int n, cudaStream_t stream) { k<<<1, 32, 0, stream>>>(x, n); return cudaGetLastError(); }
