"""The op library: what a PyTorch user calls.

``matmul`` (the op, its fused epilogues and SwiGLU), ``operands`` (the checks on the tensors
it is given), ``choice`` and ``chooser`` (which kernel runs a shape, and why), ``fp8``
(``matmul_fp8``), ``nn`` (``Linear`` and ``patch``), ``torch_op`` (the torch custom op) and
``suite`` (the shape suites, with their files in ``suites/``). ``tirx_gemm.matmul``,
``tirx_gemm.nn`` and ``tirx_gemm.torch_op`` are the public names of the modules here.
"""
