// Pitfall: cp.async from a pointer CuTe cannot place
// Expect: Expected gmem source for cp.async.
#include <cute/tensor.hpp>
using namespace cute;
__global__ void k(float const* x, float* y) {
  __shared__ alignas(16) float buf[4];
  Tensor gX = make_tensor(x, Shape<_4>{});   // raw pointer: CuTe cannot tell it is global memory
  Tensor sX = make_tensor(make_smem_ptr(buf), Shape<_4>{});                   // (4)
  copy(Copy_Atom<SM80_CP_ASYNC_CACHEALWAYS_ZFILL<uint128_t>, float>{}.with(true), gX, sX);
  cp_async_fence(); cp_async_wait<0>(); __syncthreads();
  y[threadIdx.x] = buf[threadIdx.x % 4];
}
extern "C" int run(float const* x, float* y, cudaStream_t stream) { k<<<1, 4, 0, stream>>>(x, y); return cudaGetLastError(); }
