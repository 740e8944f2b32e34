// Pitfall: A runtime value where a compile-time one is needed
// Expect: expression must have a constant value
#include <cute/tensor.hpp>
using namespace cute;
__global__ void k(float* x, int tile) {
  Tensor mX = make_tensor(make_gmem_ptr(x), make_shape(1024));  // (N)
  Tensor gX = local_tile(mX, Shape<Int<tile>>{}, make_coord(blockIdx.x));  // a runtime value as a static shape
  gX(0) = 0.0f;
}
extern "C" int run(float* x, int tile, cudaStream_t stream) { k<<<1, 1, 0, stream>>>(x, tile); return cudaGetLastError(); }
