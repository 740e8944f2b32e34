// Pitfall: Anonymous namespace around kernels
// Expect: is ambiguous [in <nvcc host stub>
#include <cute/tensor.hpp>
using namespace cute;
namespace {
__global__ void scale_kernel(float* x, int n) {
  Tensor t = make_tensor(make_gmem_ptr(x), make_shape(n));  // (N)
  if (int(threadIdx.x) < n) t(threadIdx.x) *= 2.0f;
}
}  // namespace
extern "C" int scale(float* x, int n, cudaStream_t stream) {
  scale_kernel<<<1, 128, 0, stream>>>(x, n);
  return cudaGetLastError();
}
