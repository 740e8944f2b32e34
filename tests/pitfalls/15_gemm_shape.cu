// Pitfall: gemm on mismatched fragment shapes
// Expect: static assertion failed [in cute/algorithm/gemm.hpp
#include <cute/tensor.hpp>
using namespace cute;
__global__ void k(float* c) {
  Tensor rA = make_tensor<float>(Shape<_8, _4>{});   // (M,K)
  Tensor rB = make_tensor<float>(Shape<_8, _4>{});   // (N,K)
  Tensor rC = make_tensor<float>(Shape<_8, _16>{});  // (M,N): N is 8 in B, 16 here
  clear(rA); clear(rB); clear(rC);
  gemm(rA, rB, rC);
  c[threadIdx.x] = rC(0);
}
extern "C" int run(float* c, cudaStream_t stream) { k<<<1, 32, 0, stream>>>(c); return cudaGetLastError(); }
