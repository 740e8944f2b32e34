// Pitfall: Half-precision arithmetic with a double
// Expect: more than one operator "*" matches these operands
#include <cuda_fp16.h>
__global__ void k(__half const* x, float* y) {
  y[threadIdx.x] = x[threadIdx.x] * 2.0;  // __half times double: several conversions fit
}
extern "C" int run(__half const* x, float* y, cudaStream_t stream) { k<<<1, 32, 0, stream>>>(x, y); return cudaGetLastError(); }
