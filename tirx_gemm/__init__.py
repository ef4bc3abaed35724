"""tirx-gemm: a stepwise GEMM tutorial-compiler in Apache TVM's TIRx, and the op it builds.

The lessons' kernels (fp16, bf16 and fp8 in, fp32 accumulate; sm_100a on NumSim, sm_90a on
H100 and H200) are built by ``compile/``, run by ``run/``, simulated by ``sim/`` and reported
by ``report/``; ``op/`` is what a PyTorch user calls: ``tirx_gemm.matmul``, its epilogues,
``matmul_fp8``, ``grouped_mm`` (mixture-of-experts), ``nn.Linear``, ``nn.Fp8Linear``,
``nn.Experts``, ``patch`` and ``patch_moe``, the torch custom ops, and tensor-parallel layers
(``tirx_gemm.op.parallel``).
"""
__version__ = "0.1.0"


# v14's grouped GEMM (tirx_gemm.op.grouped): one GEMM per expert, torch's grouped_mm conventions
_GROUPED = frozenset({"grouped_mm", "grouped_swiglu", "fuse_gate_up_experts", "explain_grouped"})


def __getattr__(name):
    # the op's public names are imported on first use, so that importing tirx_gemm imports
    # neither torch nor TVM: tirx_gemm.matmul (a callable module: tirx_gemm.matmul(a, b)),
    # tirx_gemm.nn, tirx_gemm.torch_op (the torch custom op) and the functions below
    if name in ("matmul", "nn", "torch_op"):
        import importlib
        return importlib.import_module(f"tirx_gemm.{name}")
    if name == "matmul_fp8":  # tirx_gemm.matmul_fp8(a, b, scale_a, scale_b): v13, e4m3
        from tirx_gemm.op.fp8 import matmul_fp8
        return matmul_fp8
    if name == "swiglu":  # fused SwiGLU
        from tirx_gemm.op.matmul import swiglu
        return swiglu
    if name == "fuse_gate_up":  # SwiGLU's interleaved weight
        from tirx_gemm.op.matmul import fuse_gate_up
        return fuse_gate_up
    if name == "grouped_swiglu":  # SwiGLU over a fused gate/up of stacked experts
        from tirx_gemm.op.grouped_swiglu import grouped_swiglu
        return grouped_swiglu
    if name in _GROUPED:
        from tirx_gemm.op import grouped
        return getattr(grouped, name)
    if name == "patch_moe":  # tirx_gemm.patch_moe(model): stacked experts -> tirx_gemm.nn.Experts
        from tirx_gemm.op.moe import patch_moe
        return patch_moe
    if name == "patch":  # tirx_gemm.patch(model): nn.Linear layers -> tirx_gemm.nn.Linear
        from tirx_gemm.nn import patch
        return patch
    raise AttributeError(f"module 'tirx_gemm' has no attribute {name!r}")
