/* A stand-in libcuda.so.1 (built with -soname libcuda.so.1 so the dynamic linker takes it) for machines with no GPU driver.
 *
 * TVM's CUDA runtime library links against the driver library. On a build machine
 * without a driver, loading this stub first lets `tvm.compile` embed the real
 * compiled kernel binary into an exported library. Every entry point answers
 * CUDA_ERROR_STUB_LIBRARY (34): nothing here can run a kernel, and nothing pretends to.
 */
#define STUB_ERR 34
#define STUB(name) int name(void) { return STUB_ERR; }

STUB(cuInit)
STUB(cuDriverGetVersion)
STUB(cuDeviceGet)
STUB(cuDeviceGetCount)
STUB(cuDeviceGetName)
STUB(cuDeviceGetAttribute)
STUB(cuFuncSetAttribute)
STUB(cuLaunchKernel)
STUB(cuLaunchKernelEx)
STUB(cuModuleGetFunction)
STUB(cuModuleLoadData)
STUB(cuModuleUnload)
STUB(cuTensorMapEncodeTiled)
STUB(cuCtxGetCurrent)
STUB(cuGetProcAddress)

int cuGetErrorName(int err, const char **out) {
  if (out) *out = "CUDA_ERROR_STUB_LIBRARY";
  return err == STUB_ERR ? 0 : 1;
}

int cuGetErrorString(int err, const char **out) {
  if (out) *out = "tirx-gemm stub libcuda: no GPU driver on this machine";
  return err == STUB_ERR ? 0 : 1;
}
