
// ---- appended by cutegen.runtime: lets Python turn a launcher's non-zero return into a message ----
#include <cuda_runtime_api.h>
extern "C" const char* cutegen_error_string(int code) {
  return cudaGetErrorString(static_cast<cudaError_t>(code));
}
extern "C" const char* cutegen_error_name(int code) {
  return cudaGetErrorName(static_cast<cudaError_t>(code));
}
