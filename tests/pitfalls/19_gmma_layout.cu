// Pitfall: A smem layout that wgmma cannot describe
// Expect: Not a canonical GMMA_K Layout: Expected stride failure.
#include <cute/tensor.hpp>
#include <cute/atom/mma_traits_sm90_gmma.hpp>
using namespace cute;
using bf16 = cutlass::bfloat16_t;
__global__ void k(float* y) {
  __shared__ alignas(1024) bf16 a[64 * 64], b[64 * 64];
  // Plain row-major tiles: wgmma reads shared memory through descriptors that need the GMMA layouts.
  Tensor sA = make_tensor(make_smem_ptr(a), Layout<Shape<_64, _64>, Stride<_64, _1>>{});  // (M,K)
  Tensor sB = make_tensor(make_smem_ptr(b), Layout<Shape<_64, _64>, Stride<_64, _1>>{});  // (N,K)
  TiledMMA mma = make_tiled_mma(SM90_64x64x16_F32BF16BF16_SS<GMMA::Major::K, GMMA::Major::K>{});
  ThrMMA thr = mma.get_slice(threadIdx.x);
  Tensor tCrA = thr.make_fragment_A(thr.partition_A(sA));
  Tensor tCrB = thr.make_fragment_B(thr.partition_B(sB));
  Tensor acc = partition_fragment_C(mma, Shape<_64, _64>{});
  gemm(mma, tCrA, tCrB, acc);
  y[threadIdx.x] = acc(0);
}
extern "C" int run(float* y, cudaStream_t stream) { k<<<1, 128, 0, stream>>>(y); return cudaGetLastError(); }
