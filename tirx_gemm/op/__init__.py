"""The op library: what a PyTorch user calls.

``matmul`` (the op, its fused epilogues and SwiGLU), ``operands`` (the checks on the tensors
it is given), ``rules`` (which kernel runs a shape, and why: one ordered list), ``cost_model`` (the
H200 cost model the rules rank with), ``keywords`` (what every kernel it builds has), ``fp8``
(``matmul_fp8``), ``nn`` (``Linear`` and ``patch``), ``torch_op`` (the torch custom op) and
``suite`` (the shape suites, with their files in ``suites/``). ``tirx_gemm.matmul``,
``tirx_gemm.nn`` and ``tirx_gemm.torch_op`` are the public names of the modules here.
"""
