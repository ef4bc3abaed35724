"""tirx-gemm: a stepwise FP16 GEMM tutorial-compiler in Apache TVM TIRx."""
__version__ = "0.1.0"
