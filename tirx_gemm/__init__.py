"""tirx-gemm: a stepwise FP16 GEMM tutorial-compiler in Apache TVM TIRx."""
__version__ = "0.1.0"


def __getattr__(name):
    # ``tirx_gemm.matmul`` (a callable module: tirx_gemm.matmul(a, b)) is imported on first
    # use, so that importing tirx_gemm imports neither torch nor TVM; so are tirx_gemm.nn,
    # tirx_gemm.torch_op (the torch custom op) and tirx_gemm.patch
    if name in ("matmul", "nn", "torch_op"):
        import importlib
        return importlib.import_module(f"tirx_gemm.{name}")
    if name == "matmul_fp8":  # tirx_gemm.matmul_fp8(a, b, scale_a, scale_b): v13, e4m3
        from tirx_gemm.fp8 import matmul_fp8
        return matmul_fp8
    if name == "swiglu":  # fused SwiGLU (issue 28): tirx_gemm.matmul's, and its weight
        from tirx_gemm.matmul import swiglu
        return swiglu
    if name == "fuse_gate_up":
        from tirx_gemm.matmul import fuse_gate_up
        return fuse_gate_up
    if name == "patch":  # tirx_gemm.patch(model): nn.Linear layers -> tirx_gemm.nn.Linear
        from tirx_gemm.nn import patch
        return patch
    raise AttributeError(f"module 'tirx_gemm' has no attribute {name!r}")
