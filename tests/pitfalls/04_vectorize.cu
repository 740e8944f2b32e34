// Pitfall: A copy atom wider than the contiguous run
// Expect: Copy_Traits: src failed to vectorize into registers. Layout is incompatible with this CopyOp.
#include <cute/tensor.hpp>
using namespace cute;
__global__ void k(float const* x, float* y) {
  // Every other float: 4 values are not contiguous, so one 128-bit access cannot move them.
  Tensor gX = make_tensor(make_gmem_ptr(x), make_layout(Shape<_4>{}, Stride<_2>{}));  // (4):(2)
  Tensor rX = make_tensor<float>(Shape<_4>{});                                           // (4)
  copy(Copy_Atom<UniversalCopy<uint128_t>, float>{}, gX, rX);
  y[threadIdx.x] = rX(0);
}
extern "C" int run(float const* x, float* y, cudaStream_t stream) { k<<<1, 32, 0, stream>>>(x, y); return cudaGetLastError(); }
