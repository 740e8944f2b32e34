// Pitfall: A tensor slice passed to a non-const reference
// Expect: no instance of function template
#include <cute/tensor.hpp>
using namespace cute;
template <class T>
__device__ void set_ones(T& t) { for (int i = 0; i < size(t); ++i) t(i) = 1.0f; }
__global__ void k(float* x) {
  Tensor mX = make_tensor(make_gmem_ptr(x), make_shape(Int<8>{}, Int<4>{}));  // (8,4)
  set_ones(mX(_, 0));  // a slice is a temporary: it cannot bind to T&
}
extern "C" int run(float* x, cudaStream_t stream) { k<<<1, 1, 0, stream>>>(x); return cudaGetLastError(); }
