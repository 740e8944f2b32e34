// Pitfall: Partitioning a tensor of lower rank than the tiler
// Expect: Rank of tensor to be partitioned too small.
#include <cute/tensor.hpp>
using namespace cute;
__global__ void k(float* x) {
  Tensor mX = make_tensor(make_gmem_ptr(x), make_shape(4096));  // (N): rank 1
  TiledCopy copy_x = make_tiled_copy(Copy_Atom<UniversalCopy<float>, float>{},
                                     Layout<Shape<_32, _4>>{}, Layout<Shape<_1, _1>>{});  // a 2-D (32x4) tiler
  Tensor tXgX = copy_x.get_slice(threadIdx.x).partition_S(mX);
  tXgX(0) = 0.0f;
}
extern "C" int run(float* x, cudaStream_t stream) { k<<<1, 128, 0, stream>>>(x); return cudaGetLastError(); }
