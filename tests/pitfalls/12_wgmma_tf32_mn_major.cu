// Pitfall: A wgmma operand in a major-ness it does not support
// Expect: MajorB must be GMMA::Major::K for this config.
#include <cute/tensor.hpp>
#include <cute/atom/mma_traits_sm90_gmma.hpp>
using namespace cute;
// wgmma reads 32-bit (tf32) operands K-major only: an MN-major B for tf32 is rejected.
using Op = decltype(GMMA::ss_op_selector<tfloat32_t, tfloat32_t, float, Shape<_64, _128, _32>,
                                          GMMA::Major::K, GMMA::Major::MN>());
__global__ void k(float* y) { y[threadIdx.x] = float(sizeof(Op)); }
extern "C" int run(float* y, cudaStream_t stream) { k<<<1, 32, 0, stream>>>(y); return cudaGetLastError(); }
