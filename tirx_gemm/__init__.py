"""tirx-gemm: a stepwise FP16 GEMM tutorial-compiler in Apache TVM TIRx."""
__version__ = "0.1.0"


def __getattr__(name):
    # ``tirx_gemm.matmul`` (a callable module: tirx_gemm.matmul(a, b)) is imported on first
    # use, so that importing tirx_gemm imports neither torch nor TVM
    if name == "matmul":
        import importlib
        return importlib.import_module("tirx_gemm.matmul")
    raise AttributeError(f"module 'tirx_gemm' has no attribute {name!r}")
