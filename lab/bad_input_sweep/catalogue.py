"""The catalogue of bad and unusual inputs sweep.py tries: ``cases(which)`` ("all", "core":
without the op library's newer parts). Each group is a function returning Cases; a case id
says what it tries (group.what)."""
from __future__ import annotations

import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from sweep import ROOT, Case  # noqa: E402

HEAD = """import torch
import torch.nn.functional as F
from tirx_gemm import matmul as mm
F16, BF16 = torch.float16, torch.bfloat16
torch.manual_seed(0)
M, N, K = 64, 128, 64
a = torch.randn(M, K).half()
b = torch.randn(N, K).half()
"""


def py(id, group, code, expect="error", needles=(), emulate=True, head=True, **kw) -> Case:
    return Case(id=id, group=group, kind="py", code=(HEAD if head else "") + code,
                expect=expect, needles=tuple(needles), emulate=emulate, **kw)


def cli(id, group, *argv, expect="error", needles=(), **kw) -> Case:
    return Case(id=id, group=group, kind="cli", argv=list(argv), expect=expect,
                needles=tuple(needles), **kw)


# --------------------------------------------------------------------------------------
# tirx_gemm.matmul: operands
# --------------------------------------------------------------------------------------
OPERANDS = [
    # (what, a, b, expect, needles)
    ("a_none", "None", "b", "error", ["a"]),
    ("a_int", "5", "b", "error", ["a", "int"]),
    ("a_list", "[[1.0] * K] * M", "b", "error", ["a", "list"]),
    ("a_numpy", "a.numpy()", "b", "error", ["a", "ndarray"]),
    ("b_none", "a", "None", "error", ["b"]),
    ("b_str", "a", "'weight'", "error", ["b", "str"]),
    ("a_float32", "a.float()", "b", "error", ["a", "float32"]),
    ("a_float64", "a.double()", "b.double()", "error", ["a", "float64"]),
    ("a_int8", "a.to(torch.int8)", "b.to(torch.int8)", "error", ["int8"]),
    ("a_bool", "a > 0", "b > 0", "error", ["bool"]),
    ("a_complex", "a.to(torch.complex64)", "b.to(torch.complex64)", "error", ["complex64"]),
    ("a_fp8", "a.to(torch.float8_e4m3fn)", "b.to(torch.float8_e4m3fn)", "error", ["float8"]),
    ("mixed_dtypes", "a", "b.bfloat16()", "error", ["bfloat16"]),
    ("a_1d", "a[0]", "b", "error", ["2-D"]),
    ("a_3d", "a.view(2, 32, K)", "b", "error", ["2-D", "reshape"]),
    ("a_0d", "a[0, 0]", "b", "error", ["2-D"]),
    ("b_3d", "a", "b.view(2, 64, K)", "error", ["2-D"]),
    ("k_mismatch", "a", "torch.randn(N, 72).half()", "error", ["72"]),
    ("k_12", "torch.randn(M, 12).half()", "torch.randn(N, 12).half()", "error", ["K=12"]),
    ("n_12", "a", "torch.randn(12, K).half()", "error", ["N=12"]),
    ("k_0", "torch.randn(M, 0).half()", "torch.randn(N, 0).half()", "either", ["K"]),
    ("n_0", "a", "torch.randn(0, K).half()", "either", ["N"]),
    ("a_transposed", "torch.randn(K, M).half().t()", "b", "work", []),
    ("b_transposed", "a", "torch.randn(K, N).half().t()", "work", []),
    ("ab_transposed", "torch.randn(K, M).half().t()", "torch.randn(K, N).half().t()", "work",
     []),
    ("a_transposed_m_300", "torch.randn(K, 300).half().t()", "b", "error",
     ["a", "contiguous"]),
    ("a_strided_both", "torch.randn(2 * K, 2 * M).half()[::2, ::2].t()", "b", "error",
     ["a", "contiguous"]),
    ("a_padded_rows", "torch.randn(M, K + 8).half()[:, :K]", "b", "error", ["contiguous"]),
    ("a_odd_offset", "torch.randn(M * K + 1).half()[1:].view(M, K)", "b", "error",
     ["aligned"]),
    ("a_expanded", "torch.randn(1, K).half().expand(M, K)", "b", "error", ["contiguous"]),
    ("a_requires_grad", "a.requires_grad_()", "b", "error", ["no_grad"]),
    ("b_requires_grad", "a", "torch.nn.Parameter(b)", "error", ["no_grad"]),
    ("a_meta", "torch.empty(M, K, dtype=F16, device='meta')", "b", "error", []),
    ("a_sparse_coo", "a.to_sparse()", "b", "error", ["to_dense"]),
    ("b_sparse_csr", "a", "b.to_sparse_csr()", "error", ["to_dense"]),
    ("a_channels_last_4d", "torch.randn(1, K, M, 1).half()", "b", "error", ["2-D"]),
    ("a_nested", "torch.nested.nested_tensor([a[:3], a[:5]])", "b", "error", ["a"]),
    ("a_quantized", "torch.quantize_per_tensor(a.float(), 0.1, 0, torch.qint8)", "b",
     "error", ["qint8"]),
    ("a_subclass_param", "torch.nn.Parameter(a, requires_grad=False)", "b", "work", []),
    ("a_inference_tensor", "a", "b", "work", []),
    ("m_1", "a[:1].clone()", "b", "work", []),
    ("m_0", "a[:0]", "b", "work", []),
    ("m_odd_13", "torch.randn(13, K).half()", "b", "work", []),
    ("a_nan", "torch.full((M, K), float('nan')).half()", "b", "work", []),
    ("a_inf", "torch.full((M, K), float('inf')).half()", "b", "work", []),
    ("bf16", "a.bfloat16()", "b.bfloat16()", "work", []),
    ("a_conj_view", "a", "b", "work", []),
    ("a_neg_bit", "a.to(torch.complex32)", "b.to(torch.complex32)", "error", ["complex32"]),
]


def matmul_operands():
    out = []
    for what, A, B, expect, needles in OPERANDS:
        emulated = "meta" not in what  # the emulated GPU is the CPU: a meta tensor is real
        check = ""
        if expect in ("work", "either"):
            check = ("ok(y.shape == (A.shape[0], B.shape[0]), f'shape {tuple(y.shape)}')\n"
                     "ok(close(y, F.linear(A.float(), B.float())), 'values differ from "
                     "F.linear')\n")
        wrap = ("with torch.inference_mode():\n    A = a.clone(); B = b.clone()\n"
                if what == "a_inference_tensor" else f"A = {A}\nB = {B}\n")
        out.append(py(f"matmul.operands.{what}", "matmul operands",
                      wrap + "y = mm.matmul(A, B)\n" + check, expect, needles,
                      emulate=emulated))
        # the same through the custom op's eager path and the epilogue path
        if expect == "error":
            out.append(py(f"torch_op.operands.{what}", "matmul operands",
                          wrap + "from tirx_gemm import torch_op\ny = torch_op.matmul(A, B)\n",
                          expect, needles, emulate=emulated))
            out.append(py(f"epilogue.operands.{what}", "matmul operands",
                          wrap + "y = mm.matmul(A, B, activation='relu')\n", expect, needles,
                          emulate=emulated))
    # not emulated: what a user on a machine without a GPU sees
    out.append(py("matmul.no_gpu.cpu_tensors", "matmul operands", "mm.matmul(a, b)\n",
                  "error", ["no CUDA GPU", "functional.linear"], emulate=False))
    out.append(py("matmul.no_gpu.float32", "matmul operands", "mm.matmul(a.float(), b.float())\n",
                  "error", ["no CUDA GPU"], emulate=False))
    out.append(py("matmul.module_call", "matmul operands",
                  "import tirx_gemm\ny = tirx_gemm.matmul(a, b)\n"
                  "ok(close(y, F.linear(a.float(), b.float())), 'values')\n", "work"))
    return out


# --------------------------------------------------------------------------------------
# tirx_gemm.matmul: keywords (bias, activation, out_dtype, step, out, sync)
# --------------------------------------------------------------------------------------
KEYWORDS = [
    # (what, call arguments after a, b; expect; needles; reference or None)
    ("bias_true", "bias=True", "error", ["bias", "bool"], None),
    ("bias_list", "bias=[0.0] * N", "error", ["bias", "list"], None),
    ("bias_float", "bias=1.5", "error", ["bias", "float"], None),
    ("bias_int_dtype", "bias=torch.zeros(N, dtype=torch.int32)", "error", ["bias", "int32"],
     None),
    ("bias_float64", "bias=torch.zeros(N, dtype=torch.float64)", "error", ["float64"], None),
    ("bias_wrong_len", "bias=torch.zeros(N + 8).half()", "error", ["bias", "136"], None),
    ("bias_2d", "bias=torch.zeros(1, N).half()", "error", ["bias", "(1, 128)"], None),
    ("bias_scalar_tensor", "bias=torch.tensor(1.0).half()", "error", ["bias"], None),
    ("bias_strided", "bias=torch.zeros(2 * N).half()[::2]", "error", ["bias", "contiguous"],
     None),
    ("bias_meta", "bias=torch.zeros(N, dtype=F16, device='meta')", "error", [],
     None),
    ("bias_requires_grad", "bias=torch.zeros(N).half().requires_grad_()", "error",
     ["no_grad"], None),
    ("bias_sparse", "bias=torch.zeros(N).half().to_sparse()", "error", ["bias"], None),
    ("bias_fp16", "bias=torch.randn(N).half()", "work", [],
     "F.linear(a.float(), b.float(), kw['bias'].float())"),
    ("bias_fp32", "bias=torch.randn(N)", "work", [],
     "F.linear(a.float(), b.float(), kw['bias'].float())"),
    ("bias_bf16_on_fp16", "bias=torch.randn(N).bfloat16()", "either", ["bias"],
     "F.linear(a.float(), b.float(), kw['bias'].float())"),
    ("act_relu", "activation='relu'", "work", [], "F.relu(F.linear(a.float(), b.float()))"),
    ("act_gelu", "activation='gelu'", "work", [], "F.gelu(F.linear(a.float(), b.float()))"),
    ("act_gelu_tanh", "activation='gelu_tanh'", "work", [],
     "F.gelu(F.linear(a.float(), b.float()), approximate='tanh')"),
    ("act_silu", "activation='silu'", "work", [], "F.silu(F.linear(a.float(), b.float()))"),
    ("act_upper", "activation='ReLU'", "error", ["ReLU", "relu"], None),
    ("act_tanh", "activation='tanh'", "error", ["tanh"], None),
    ("act_empty", "activation=''", "error", ["activation"], None),
    ("act_int", "activation=5", "error", ["activation"], None),
    ("act_module", "activation=torch.nn.ReLU()", "error", ["activation"], None),
    ("act_function", "activation=F.relu", "error", ["activation"], None),
    ("act_swish", "activation='swish'", "error", ["swish"], None),
    ("act_none_string", "activation='none'", "error", ["none"], None),
    ("out_dtype_fp32", "out_dtype=torch.float32", "work", [], "F.linear(a.float(), b.float())"),
    ("out_dtype_fp32_str", "out_dtype='float32'", "either", ["out_dtype"],
     "F.linear(a.float(), b.float())"),
    ("out_dtype_same", "out_dtype=torch.float16", "work", [], "F.linear(a.float(), b.float())"),
    ("out_dtype_bf16_on_fp16", "out_dtype=torch.bfloat16", "error", ["out_dtype"], None),
    ("out_dtype_fp64", "out_dtype=torch.float64", "error", ["out_dtype"], None),
    ("out_dtype_int", "out_dtype=torch.int32", "error", ["out_dtype"], None),
    ("out_dtype_garbage", "out_dtype='fp32'", "error", ["fp32"], None),
    ("out_dtype_python_float", "out_dtype=float", "error", ["out_dtype"], None),
    ("step_int", "step=5", "error", ["step=5", "int"], None),
    ("step_v99", "step='v99'", "error", ["v99"], None),
    ("step_space", "step=' v9'", "error", ["' v9'"], None),
    ("step_empty", "step=''", "error", ["step"], None),
    ("step_v9", "step='v9'", "work", [], "F.linear(a.float(), b.float())"),
    ("step_upper", "step='V9'", "work", [], "F.linear(a.float(), b.float())"),
    ("step_number_string", "step='9'", "work", [], "F.linear(a.float(), b.float())"),
    ("step_v1_at_another_shape", "step='v1'", "either", ["v1"], None),
    ("step_v12", "step='v12'", "work", [], "F.linear(a.float(), b.float())"),
    ("step_v9_relu", "step='v9', activation='relu'", "error", ["v9", "epilogue"], None),
    ("step_v10_relu", "step='v10', activation='relu'", "work", [],
     "F.relu(F.linear(a.float(), b.float()))"),
    ("step_list", "step=['v9']", "error", ["step"], None),
    ("out_wrong_shape", "out=torch.empty(N, M).half()", "error", ["out", "(64, 128)"], None),
    ("out_wrong_dtype", "out=torch.empty(M, N)", "error", ["out", "float32"], None),
    ("out_int", "out=5", "error", ["out", "int"], None),
    ("out_same_as_a", "out=a", "error", ["out"], None),
    ("out_transposed", "out=torch.empty(N, M).half().t()", "error", ["out", "contiguous"],
     None),
    ("out_meta", "out=torch.empty(M, N, dtype=F16, device='meta')", "error", [],
     None),
    ("out_requires_grad", "out=torch.empty(M, N).half().requires_grad_()", "error", ["out"],
     None),
    ("out_fresh", "out=torch.empty(M, N).half()", "work", [], "F.linear(a.float(), b.float())"),
    ("out_fp32_epilogue", "out_dtype=torch.float32, out=torch.empty(M, N).half()", "error",
     ["out", "float32"], None),
    ("out_odd_offset", "out=torch.empty(M * N + 1).half()[1:].view(M, N)", "error",
     ["out", "aligned"], None),
    ("sync_string", "sync='no'", "either", ["sync"], "F.linear(a.float(), b.float())"),
    ("unknown_keyword", "bais=torch.zeros(N).half()", "error", ["bais"], None),
    ("positional_too_many", "None, None, None, None", "error", ["positional"], None),
    ("activation_positional", "None, 'relu'", "work", [], "F.relu(F.linear(a.float(), b.float()))"),
]


def matmul_keywords():
    out = []
    for what, args, expect, needles, ref in KEYWORDS:
        code = f"kw = dict({args})\n" if "=" in args and not args.startswith("None") else ""
        call = f"y = mm.matmul(a, b, {args})\n" if not code else "y = mm.matmul(a, b, **kw)\n"
        check = ""
        if ref:
            check = (f"ref = {ref}\nok(close(y, ref), 'values differ from torch')\n"
                     "want = kw.get('out_dtype') if 'kw' in dir() and kw.get('out_dtype') "
                     "not in (None, 'float32') else None\n")
        out.append(py(f"matmul.keywords.{what}", "matmul keywords", code + call + check,
                      expect, needles, emulate="meta" not in what))
    # out overlapping an input at another offset, every path
    overlap = ("buf = torch.empty(M * K + M * N).half()\nA = buf[:M * K].view(M, K)\n"
               "A.copy_(a)\nO = buf[8 * K:8 * K + M * N].view(M, N)\n")
    for path, call in (("plain", "mm.matmul(A, b, out=O)"),
                       ("epilogue", "mm.matmul(A, b, activation='relu', out=O)"),
                       ("torch_op", "__import__('tirx_gemm.torch_op').torch_op.matmul(A, b, out=O)")):
        out.append(py(f"matmul.overlap.{path}", "matmul keywords", overlap + call + "\n",
                      "error", ["overlaps", "a"]))
    out.append(py("matmul.overlap.bias_in_out", "matmul keywords",
                  "O = torch.empty(M, N).half()\nmm.matmul(a, b, O[-1], out=O)\n", "error",
                  ["overlaps", "bias"]))
    out.append(py("matmul.repeat_then_bad_b", "matmul keywords",
                  "mm.matmul(a, b)\nmm.matmul(a, b.float())\n", "error", ["b", "float32"]))
    out.append(py("matmul.repeat_then_out_shape", "matmul keywords",
                  "mm.matmul(a, b)\nmm.matmul(a, b, out=torch.empty(M, N + 8).half())\n",
                  "error", ["out"]))
    out.append(py("matmul.grad_mode_off", "matmul keywords",
                  "with torch.no_grad():\n    y = mm.matmul(a.requires_grad_(), b)\n"
                  "ok(close(y, F.linear(a.float(), b.float())), 'values')\n", "work"))
    return out


# --------------------------------------------------------------------------------------
# swiglu and fuse_gate_up
# --------------------------------------------------------------------------------------
SW_HEAD = """g = torch.randn(N, K).half() / 8
u = torch.randn(N, K).half() / 8
def ref_swiglu(x, g, u):
    return F.silu(x.float() @ g.float().T) * (x.float() @ u.float().T)
"""

SWIGLU = [
    ("concatenated", "y = mm.swiglu(a, fused=torch.cat([g, u]))", "error", ["fuse_gate_up"]),
    ("random_fused", "y = mm.swiglu(a, fused=torch.randn(2 * N, K).half())", "error",
     ["fuse_gate_up"]),
    ("fused_and_gate", "f = mm.fuse_gate_up(g, u)\ny = mm.swiglu(a, g, fused=f)", "error",
     ["not both"]),
    ("only_gate", "y = mm.swiglu(a, g)", "error", ["w_up"]),
    ("nothing", "y = mm.swiglu(a)", "error", ["w_gate"]),
    ("shape_mismatch", "y = mm.swiglu(a, g, u[:64])", "error", ["w_up"]),
    ("dtype_mismatch", "y = mm.swiglu(a, g, u.bfloat16())", "error", ["bfloat16"]),
    ("n_12", "y = mm.swiglu(a, g[:12], u[:12])", "error", ["12"]),
    ("odd_fused_rows", "y = mm.swiglu(a, fused=torch.randn(24, K).half())", "error", ["24"]),
    ("gate_1d", "y = mm.fuse_gate_up(g[0], u[0])", "error", ["2-D"]),
    ("gate_list", "y = mm.fuse_gate_up([[0.0]], u)", "error", ["w_gate", "list"]),
    ("gate_none", "y = mm.fuse_gate_up(None, u)", "error", ["w_gate"]),
    ("fused_after_half", "f = mm.fuse_gate_up(g.float(), u.float()).half()\n"
                         "y = mm.swiglu(a, fused=f)", "error", ["fuse_gate_up"]),
    ("fused_after_clone", "f = mm.fuse_gate_up(g, u).clone()\ny = mm.swiglu(a, fused=f)",
     "error", ["fuse_gate_up"]),
    ("fused_slice", "f = mm.fuse_gate_up(g, u)[:N]\ny = mm.swiglu(a, fused=f)", "error",
     ["fuse_gate_up"]),
    ("a_wrong_k", "y = mm.swiglu(torch.randn(M, 72).half(), g, u)", "error", ["72"]),
    ("a_float32", "y = mm.swiglu(a.float(), g, u)", "error", ["float32"]),
    ("with_bias_kw", "y = mm.swiglu(a, g, u, bias=torch.zeros(N).half())", "error", ["bias"]),
    ("out_dtype_bad", "y = mm.swiglu(a, g, u, out_dtype=torch.int8)", "error", ["out_dtype"]),
    ("torch_op_concatenated", "from tirx_gemm import torch_op\n"
                              "y = torch_op.swiglu(a, torch.cat([g, u]))", "error",
     ["fuse_gate_up"]),
]


def swiglu():
    out = [py(f"swiglu.{w}", "swiglu", SW_HEAD + c + "\n", e, n) for w, c, e, n in SWIGLU]
    works = [
        ("separate", "y = mm.swiglu(a, g, u)"),
        ("fused", "y = mm.swiglu(a, fused=mm.fuse_gate_up(g, u))"),
        ("fused_param_moved", "m = torch.nn.Module()\n"
                              "m.w = torch.nn.Parameter(mm.fuse_gate_up(g.float(), u.float()), "
                              "requires_grad=False)\nm.half()\ny = mm.swiglu(a, fused=m.w)"),
        ("fused_fp32_out", "y = mm.swiglu(a, g, u, out_dtype=torch.float32)\n"
                           "ok(y.dtype == torch.float32, f'dtype {y.dtype}')"),
        ("fused_detach", "y = mm.swiglu(a, fused=mm.fuse_gate_up(g, u).detach())"),
        ("torch_op_fused", "from tirx_gemm import torch_op\n"
                           "y = torch_op.swiglu(a, mm.fuse_gate_up(g, u))"),
    ]
    for w, c in works:
        out.append(py(f"swiglu.works.{w}", "swiglu", SW_HEAD + c + "\n"
                      "ok(close(y, ref_swiglu(a, g, u)), 'values differ from the SwiGLU "
                      "reference')\n", "work"))
    return out


# --------------------------------------------------------------------------------------
# choose / explain
# --------------------------------------------------------------------------------------
CHOOSE = [
    ("negative_m", "-5, 4096, 4096", "error", ["M=-5", "positive"]),
    ("zero_m", "0, 4096, 4096", "error", ["M=0"]),
    ("float_m", "128.0, 4096, 4096", "error", ["M=128.0"]),
    ("string_m", "'128', 4096, 4096", "error", ["M='128'"]),
    ("bool_m", "True, 4096, 4096", "error", ["M=True"]),
    ("none_n", "128, None, 4096", "error", ["N=None"]),
    ("n_12", "128, 12, 4096", "error", ["N=12"]),
    ("k_4100", "128, 4096, 4100", "error", ["K=4100"]),
    ("huge_m", "2**40, 4096, 4096", "error", ["M"]),
    ("m_past_int32", "2**31, 4096, 4096", "error", ["M"]),
    ("huge_n", "128, 2**34, 4096", "error", ["N"]),
    ("numpy_int", "__import__('numpy').int64(128), 4096, 4096", "either", ["M"]),
    ("dtype_fp16_alias", "128, 4096, 4096, 'fp16'", "error", ["fp16"]),
    ("dtype_float32", "128, 4096, 4096, 'float32'", "error", ["float32"]),
    ("dtype_torch_bf16", "128, 4096, 4096, torch.bfloat16", "work", []),
    ("dtype_torch_fp32", "128, 4096, 4096, torch.float32", "error", ["float32"]),
    ("dtype_none", "128, 4096, 4096, None", "error", ["dtype"]),
    ("arch_sm80", "128, 4096, 4096, 'float16', 'sm_80'", "error", ["sm_80"]),
    ("arch_upper", "128, 4096, 4096, 'float16', 'SM_90A'", "error", ["SM_90A"]),
    ("arch_sm90", "128, 4096, 4096, 'float16', 'sm_90'", "error", ["sm_90"]),
    ("arch_blackwell", "128, 4096, 4096, 'float16', 'sm_100a'", "work", []),
    ("sm_count_0", "128, 4096, 4096, 'float16', 'sm_90a', 0", "error", ["sm_count"]),
    ("sm_count_neg", "128, 4096, 4096, 'float16', 'sm_90a', -1", "error", ["sm_count"]),
    ("sm_count_str", "128, 4096, 4096, 'float16', 'sm_90a', '132'", "error", ["sm_count"]),
    ("sm_count_huge", "128, 4096, 4096, 'float16', 'sm_90a', 10**6", "either", ["sm_count"]),
    ("sm_count_float", "128, 4096, 4096, 'float16', 'sm_90a', 132.0", "error", ["sm_count"]),
    ("epilogue_bad_key", "128, 4096, 4096, epilogue={'BAIS': 'float16'}", "error", ["BAIS"]),
    ("epilogue_bad_act", "128, 4096, 4096, epilogue={'ACT': 'tanh'}", "error", ["tanh"]),
    ("epilogue_list", "128, 4096, 4096, epilogue=['relu']", "error", ["epilogue"]),
    ("epilogue_on_blackwell", "128, 4096, 4096, 'float16', 'sm_100a', "
                              "epilogue={'ACT': 'relu'}", "error", ["sm_100a"]),
    ("epilogue_ok", "128, 4096, 4096, epilogue={'ACT': 'relu'}", "work", []),
    ("card_bogus", "128, 4096, 4096, card='h300'", "error", ["h300"]),
    ("card_upper", "128, 4096, 4096, card='H100'", "either", ["H100"]),
    ("card_int", "128, 4096, 4096, card=5", "error", ["card"]),
    ("card_auto_no_gpu", "128, 4096, 4096, card='auto'", "either", ["auto"]),
]


def choose_explain():
    out = []
    for what, args, expect, needles in CHOOSE:
        for fn in ("choose", "explain"):
            code = f"r = mm.{fn}({args})\n"
            if expect == "work":
                code += ("ok(r, 'empty answer')\n")
            out.append(py(f"{fn}.{what}", "choose and explain", code, expect, needles,
                          emulate=False))
    out.append(py("variants.bad_n", "choose and explain", "mm.variants(12, 4096)\n", "error",
                  ["N=12"], emulate=False))
    out.append(py("variants.bad_arch", "choose and explain",
                  "mm.variants(4096, 4096, arch='sm_80')\n", "error", ["sm_80"],
                  emulate=False))
    out.append(py("variants.bad_dtype", "choose and explain",
                  "mm.variants(4096, 4096, dtype='int8')\n", "error", ["int8"], emulate=False))
    out.append(py("variants.torch_dtype", "choose and explain",
                  "r = mm.variants(4096, 4096, dtype=torch.bfloat16)\nok(r, 'empty')\n",
                  "work", [], emulate=False))
    return out


# --------------------------------------------------------------------------------------
# fp8
# --------------------------------------------------------------------------------------
FP8_HEAD = """from tirx_gemm.op import fp8
E4 = torch.float8_e4m3fn
x = torch.randn(M, K * 2)
w = torch.randn(N, K * 2)
qa, sa = fp8.quantize(x, 'tensor', 'a')
qb, sb = fp8.quantize(w, 'tensor', 'b')
one = torch.ones((), dtype=torch.float32)
"""

FP8 = [
    ("a_fp16", "fp8.matmul_fp8(x.half(), qb, sa, sb)", "error", ["a", "float16"]),
    ("a_e5m2", "fp8.matmul_fp8(x.to(torch.float8_e5m2), qb, sa, sb)", "error", ["e5m2"]),
    ("scale_fp16", "fp8.matmul_fp8(qa, qb, sa.half(), sb)", "error", ["scale_a", "float16"]),
    ("scale_python_float", "fp8.matmul_fp8(qa, qb, 1.0, sb)", "error", ["scale_a", "float"]),
    ("scale_wrong_shape", "fp8.matmul_fp8(qa, qb, torch.ones(3), sb)", "error", ["scale"]),
    ("scale_row_wrong_len", "fp8.matmul_fp8(qa, qb, torch.ones(M + 1, 1), sb)", "error",
     ["scale"]),
    ("scale_nan", "fp8.matmul_fp8(qa, qb, torch.tensor(float('nan')), sb)", "either",
     ["scale_a"]),
    ("scale_negative", "fp8.matmul_fp8(qa, qb, -sa, sb)", "either", ["scale_a"]),
    ("scale_zero", "fp8.matmul_fp8(qa, qb, sa * 0, sb)", "either", ["scale_a"]),
    ("out_dtype_fp32", "fp8.matmul_fp8(qa, qb, sa, sb, torch.float32)", "error",
     ["out_dtype"]),
    ("out_dtype_str", "fp8.matmul_fp8(qa, qb, sa, sb, 'bfloat16')", "error", ["out_dtype"]),
    ("k_24", "fp8.matmul_fp8(qa[:, :24].contiguous(), qb[:, :24].contiguous(), sa, sb)",
     "error", ["K=24"]),
    ("n_12", "fp8.matmul_fp8(qa, qb[:12].contiguous(), sa, sb)", "error", ["N=12"]),
    ("k_mismatch", "fp8.matmul_fp8(qa, qb[:, :64].contiguous(), sa, sb)", "error", ["K"]),
    ("a_1d", "fp8.matmul_fp8(qa[0], qb, sa, sb)", "error", ["2-D"]),
    ("a_transposed", "fp8.matmul_fp8(qa.t().contiguous().t(), qb, sa, sb)", "error",
     ["contiguous"]),
    ("out_overlap", "o = torch.empty(M, N, dtype=torch.bfloat16)\n"
                    "fp8.matmul_fp8(qa, qb, sa, o.view(torch.float32).view(-1)[:1].view(()), "
                    "out=o)", "error", ["overlaps"]),
    ("out_wrong_dtype", "fp8.matmul_fp8(qa, qb, sa, sb, out=torch.empty(M, N).half())",
     "error", ["out"]),
    ("requires_grad", "fp8.matmul_fp8(qa, qb, sa.requires_grad_(), sb)", "error", ["no_grad"]),
    ("quantize_bad_mode", "fp8.quantize(x, 'channel', 'a')", "error", ["channel"]),
    ("quantize_bad_operand", "fp8.quantize(x, 'tensor', 'c')", "error", ["operand"]),
    ("quantize_3d", "fp8.quantize(x.view(2, 32, -1), 'tensor', 'a')", "error", ["2-D"]),
    ("quantize_int", "fp8.quantize(torch.ones(4, 4, dtype=torch.int32), 'tensor', 'a')",
     "either", ["int32"]),
    ("quantize_none", "fp8.quantize(None, 'tensor', 'a')", "error", ["x"]),
    ("quantize_nan", "q, s = fp8.quantize(torch.full((4, 16), float('nan')), 'tensor', 'a')",
     "either", ["nan"]),
    ("quantize_inf", "q, s = fp8.quantize(torch.full((4, 16), float('inf')), 'row', 'a')",
     "either", ["inf"]),
    ("block_k_200", "qa2, sa2 = fp8.quantize(torch.randn(M, 200), 'block', 'a')\n"
                    "qb2, sb2 = fp8.quantize(torch.randn(N, 200), 'block', 'b')\n"
                    "fp8.matmul_fp8(qa2, qb2, sa2, sb2)", "error", ["K=200"]),
    ("sparse_a", "fp8.matmul_fp8(torch.zeros(M, 128).to_sparse(), qb, sa, sb)", "error",
     ["to_dense"]),
    ("choose_bad_mode", "fp8.choose_fp8(128, 'channel', False)", "error", ["channel"]),
    ("choose_m_0", "fp8.choose_fp8(0, 'tensor', False)", "either", ["M"]),
]


def fp8_cases():
    out = [py(f"fp8.{w}", "fp8", FP8_HEAD + c + "\n", e, n) for w, c, e, n in FP8]
    for mode in ("tensor", "row", "block"):
        out.append(py(f"fp8.works.{mode}", "fp8", FP8_HEAD + f"""
qa, sa = fp8.quantize(x, {mode!r}, 'a')
qb, sb = fp8.quantize(w, {mode!r}, 'b')
y = fp8.matmul_fp8(qa, qb, sa, sb)
ok(y.dtype == torch.bfloat16, f'dtype {{y.dtype}}')
ok(close(y, fp8.reference(qa, qb, sa, sb, {mode!r}), 5e-2), 'values differ from fp8.reference')
""", "work"))
    out.append(py("fp8.no_gpu", "fp8", FP8_HEAD + "fp8.matmul_fp8(qa, qb, sa, sb)\n", "error",
                  ["no CUDA GPU"], emulate=False))
    return out


# --------------------------------------------------------------------------------------
# nn.Linear and patch
# --------------------------------------------------------------------------------------
NN_HEAD = """from tirx_gemm import nn as tnn
import tirx_gemm
torch.Tensor.get_device = lambda self: 0 if self.device.type == 'cpu' else -1
tnn._device_refusal = lambda device: None
x = torch.randn(4, 7, K).half()
"""

NN = [
    ("patch_none", "tirx_gemm.patch(None)", "error", ["Module", "NoneType"]),
    ("patch_int", "tirx_gemm.patch(5)", "error", ["Module", "int"]),
    ("patch_state_dict", "tirx_gemm.patch(torch.nn.Linear(K, N).state_dict())", "error",
     ["Module"]),
    ("patch_class", "tirx_gemm.patch(torch.nn.Linear)", "error", ["Module"]),
    ("linear_strict_fp32", "l = tnn.Linear(K, N, strict=True)\nl(x.float())", "error",
     ["cannot run", "float32"]),
    ("linear_strict_wrong_features", "l = tnn.Linear(K, N, strict=True).half()\n"
                                     "with torch.no_grad():\n    l(torch.randn(3, 72).half())",
     "error", ["72"]),
    ("linear_wrong_features", "l = tnn.Linear(K, N).half()\nl(torch.randn(3, 72).half())",
     "error", ["72"]),
    ("linear_int_input", "l = tnn.Linear(K, N).half()\nl(torch.ones(3, K, dtype=torch.long))",
     "error", ["Long"]),
    ("linear_string_input", "l = tnn.Linear(K, N).half()\nl('hello')", "error", ["str"]),
    # torch.nn.Linear's own constructor errors: a subclass raises what torch raises
    ("linear_bad_features", "tnn.Linear(-1, N)", "error", []),
    ("linear_float_features", "tnn.Linear(64.5, N)", "error", []),
    ("from_linear_int", "tnn.Linear.from_linear(5)", "error", ["Linear", "int"]),
    ("from_linear_conv", "tnn.Linear.from_linear(torch.nn.Conv1d(4, 4, 1))", "error",
     ["Linear"]),
]


def nn_cases():
    out = [py(f"nn.{w}", "nn.Linear and patch", NN_HEAD + c + "\n", e, n, torch_ok=True)
           for w, c, e, n in NN]
    works = {
        "patch_sequential": """
m = torch.nn.Sequential(torch.nn.Linear(K, N), torch.nn.ReLU(), torch.nn.Linear(N, K)).half()
ref = m(x).float()
rep = tirx_gemm.patch(m)
ok(len(rep.replaced) == 2, f'replaced {rep.replaced} kept {rep.kept}')
with torch.no_grad():
    y = m(x)
ok(close(y, ref), 'patched model gives other values')
ok(all(type(l) is tnn.Linear for l in (m[0], m[2])), 'not replaced')
""",
        "patch_fp32_kept": """
m = torch.nn.Sequential(torch.nn.Linear(K, N))
rep = tirx_gemm.patch(m)
ok(len(rep.kept) == 1 and 'float32' in rep.kept[0][1], f'kept {rep.kept}')
ok(type(m[0]) is torch.nn.Linear, 'an fp32 layer was replaced')
""",
        "patch_odd_features_kept": """
m = torch.nn.Sequential(torch.nn.Linear(K, 12)).half()
rep = tirx_gemm.patch(m)
ok(len(rep.kept) == 1 and '12' in rep.kept[0][1], f'kept {rep.kept}')
""",
        "patch_weight_norm_kept": """
m = torch.nn.Sequential(torch.nn.utils.parametrizations.weight_norm(torch.nn.Linear(K, N))).half()
rep = tirx_gemm.patch(m)
ok(type(m[0]) is not tnn.Linear, 'a parametrized layer was replaced')
ok(len(rep.kept) == 1, f'kept {rep.kept}')
""",
        "patch_twice": """
m = torch.nn.Sequential(torch.nn.Linear(K, N)).half()
tirx_gemm.patch(m)
rep = tirx_gemm.patch(m)
ok(type(m[0]) is tnn.Linear, 'lost the replacement')
with torch.no_grad():
    y = m(x)
ok(close(y, F.linear(x.float(), m[0].weight.float(), m[0].bias.float())), 'values')
""",
        "patch_keeps_state_dict": """
m = torch.nn.Sequential(torch.nn.Linear(K, N)).half()
before = {k: v.clone() for k, v in m.state_dict().items()}
tirx_gemm.patch(m)
after = m.state_dict()
ok(sorted(before) == sorted(after), f'keys {sorted(after)}')
ok(all(torch.equal(before[k], after[k]) for k in before), 'values changed')
""",
        "patch_moves_forward_hook": """
m = torch.nn.Sequential(torch.nn.Linear(K, N)).half()
seen = []
m[0].register_forward_hook(lambda mod, i, o: seen.append(1))
tirx_gemm.patch(m)
with torch.no_grad():
    m(x)
ok(seen == [1], f'hook ran {len(seen)} times')
""",
        "patch_subclass_kept": """
class My(torch.nn.Linear):
    def forward(self, x):
        return super().forward(x) * 2
m = torch.nn.Sequential(My(K, N)).half()
rep = tirx_gemm.patch(m)
ok(type(m[0]) is My, 'a subclass with its own forward was replaced')
""",
        "patch_shared_layer": """
l = torch.nn.Linear(K, N).half()
m = torch.nn.ModuleDict({'a': l, 'b': l})
tirx_gemm.patch(m)
ok(m['a'] is m['b'], 'a shared layer became two')
""",
        "patch_root_linear": """
l = torch.nn.Linear(K, N).half()
rep = tirx_gemm.patch(l)
ok(type(rep.module) is tnn.Linear, f'report module {type(rep.module)}')
""",
        "linear_fallback_warns": """
l = tnn.Linear(K, N)
y = l(x.float())
ok(l.fallbacks == 1, f'fallbacks {l.fallbacks}')
ok(any('F.linear' in w for w in _warned), f'warnings {_warned}')
""",
        "linear_1d_input": """
l = tnn.Linear(K, N).half()
with torch.no_grad():
    y = l(x[0, 0])
ok(y.shape == (N,), f'shape {tuple(y.shape)}')
ok(close(y, F.linear(x[0, 0].float(), l.weight.float(), l.bias.float())), 'values')
""",
        "linear_empty_batch": """
l = tnn.Linear(K, N).half()
with torch.no_grad():
    y = l(torch.randn(0, K).half())
ok(y.shape == (0, N), f'shape {tuple(y.shape)}')
""",
        "linear_noncontiguous_input": """
l = tnn.Linear(K, N).half()
xt = torch.randn(K, 5).half().t()
with torch.no_grad():
    y = l(xt)
ok(close(y, F.linear(xt.float(), l.weight.float(), l.bias.float())), 'values')
""",
        "linear_grad_mode_trains_on_the_kernels": """
from tirx_gemm.op import autograd as AG
routed = []
real = AG.linear
AG.linear = lambda *a, **k: routed.append(1) or real(*a, **k)
l = tnn.Linear(K, N).half()
y = l(x)
AG.linear = real
ok(l.fallbacks == 0 and routed == [1] and y.requires_grad, f'fallbacks {l.fallbacks} routed {routed}')
""",
    }
    for w, code in works.items():
        out.append(py(f"nn.works.{w}", "nn.Linear and patch", NN_HEAD + code, "work"))
    out.append(py("nn.patch_all_or_nothing", "nn.Linear and patch", NN_HEAD + """
m = torch.nn.Sequential(torch.nn.Linear(K, N), torch.nn.Linear(N, K)).half()
calls = []
real = tnn._replacement
def failing(layer, strict):
    calls.append(1)
    if len(calls) == 2:
        raise RuntimeError('planted failure')
    return real(layer, strict)
tnn._replacement = failing
try:
    tirx_gemm.patch(m)
except RuntimeError:
    pass
ok(type(m[0]) is torch.nn.Linear, 'the first layer stayed replaced after a failure')
""", "work"))
    return out


# --------------------------------------------------------------------------------------
# settings variables
# --------------------------------------------------------------------------------------
def settings_cases():
    out = []
    read = "from tirx_gemm import settings\nv = settings.get({name!r})\n"
    bad = [
        ("TIRX_GEMM_KERNEL_TIMEOUT", "abc"), ("TIRX_GEMM_KERNEL_TIMEOUT", "-1"),
        ("TIRX_GEMM_KERNEL_TIMEOUT", "0"), ("TIRX_GEMM_KERNEL_TIMEOUT", "nan"),
        ("TIRX_GEMM_KERNEL_TIMEOUT", "1e400"), ("TIRX_GEMM_KERNEL_TIMEOUT", "99999"),
        ("TIRX_GEMM_KERNEL_TIMEOUT", ""), ("TIRX_GEMM_TOOL_TIMEOUT", "inf"),
        ("TIRX_GEMM_TOOL_TIMEOUT", "١٢"),
        ("TIRX_GEMM_CACHE", "~nosuchuser/c"), ("TIRX_GEMM_CACHE", "relative/dir"),
        ("TIRX_GEMM_BUNDLE_SHA256", "xyz"), ("TIRX_GEMM_BUNDLE_SHA256", "A" * 63),
        ("TIRX_GEMM_SYSTEM_CUDA", "maybe"), ("TIRX_GEMM_DEBUG", "2"),
        ("TIRX_GEMM_NUMSIM_CRATES", "vendor"), ("TIRX_GEMM_TVM_FRAMES", "fast"),
        ("TIRX_GEMM_GIT_SHA", "not-a-sha"), ("TIRX_GEMM_BUNDLE", ""),
    ]
    for name, value in bad:
        expect = "either" if (name, value) in (("TIRX_GEMM_CACHE", "relative/dir"),
                                               ("TIRX_GEMM_BUNDLE", ""),
                                               ("TIRX_GEMM_KERNEL_TIMEOUT", ""),
                                               ("TIRX_GEMM_TOOL_TIMEOUT", "١٢")) else "error"
        slug = "".join(ch if ch.isalnum() else "_" for ch in value)[:12] or "empty"
        out.append(Case(id=f"settings.{name.lower()[10:]}.{slug}", group="settings",
                        kind="py", code=read.format(name=name), expect=expect,
                        needles=(name,), env={name: value}))
    for typo in ("TIRX_GEMM_BUNDEL", "TIRX_GEMM_KERNEL_TIMOUT", "TIRX_GEMM_BUNDLE_SHA"):
        out.append(Case(id=f"settings.typo.{typo.lower()}", group="settings", kind="py",
                        code=HEAD + "emulate()\nmm.matmul(a, b)\n", expect="warn",
                        needles=(typo,), env={typo: "1"}))
        out.append(Case(id=f"settings.typo_cli.{typo.lower()}", group="settings", kind="cli",
                        argv=["choose", "128,4096,4096"], expect="warn", needles=(typo,),
                        env={typo: "1"}))
    out.append(Case(id="settings.table_into_head", group="settings", kind="sh",
                    argv=["bash", "-c", f"{sys.executable} -m tirx_gemm.settings | head -1"],
                    expect="work"))
    out.append(Case(id="settings.bad_pin_in_matmul", group="settings", kind="py",
                    code=HEAD + "_real = mm._load\nemulate()\nmm._load = _real\n"
                         "mm.matmul(a, b)\n", expect="error",
                    needles=("TIRX_GEMM_BUNDLE_SHA256",),
                    env={"TIRX_GEMM_BUNDLE_SHA256": "xyz", "TIRX_GEMM_BUNDLE": "{T}"},
                    files={"manifest.json": json.dumps({"format": 2, "kernels": [],
                                                        "files": {}})}))
    out.append(Case(id="settings.timeout_in_sync", group="settings", kind="py",
                    code="from tirx_gemm import settings\n"
                         "settings.env_seconds('TIRX_GEMM_KERNEL_TIMEOUT', 60)\n",
                    expect="error", needles=("TIRX_GEMM_KERNEL_TIMEOUT",),
                    env={"TIRX_GEMM_KERNEL_TIMEOUT": "-5"}))
    return out


# --------------------------------------------------------------------------------------
# the CLI
# --------------------------------------------------------------------------------------
def cli_cases():
    out = []
    add = out.append
    add(cli("cli.no_command", "cli", expect="either"))
    add(cli("cli.unknown_command", "cli", "biuld", needles=["biuld"]))
    add(cli("cli.help", "cli", "--help", expect="work"))
    add(cli("cli.unknown_flag", "cli", "list", "--fast", needles=["--fast"]))
    add(cli("cli.list", "cli", "list", expect="work"))
    add(cli("cli.list_bad_arch", "cli", "list", "--arch", "sm_80", needles=["sm_80"]))
    add(cli("cli.list_unicode_arch", "cli", "list", "--arch", "sm_９０a", needles=["sm_"]))
    # build / show: invalid steps and shapes (refused before any compile)
    for what, step in (("v99", "v99"), ("space", " v1"), ("empty", ""), ("dash", "-v1"),
                       ("unicode", "v１"), ("path", "../v1"), ("long", "v" + "9" * 5000)):
        add(cli(f"cli.build.step_{what}", "cli", "build", step, needles=[step[:20].strip()]
                if step.strip() and what != "long" else []))
        add(cli(f"cli.show.step_{what}", "cli", "show", step, needles=[step[:20].strip()]
                if step.strip() and what != "long" else []))
    valid = {"unicode", "spaces", "x_sep"}  # read as 128,128,64: accepted, not silent
    for what, mnk, needle in (("letters", "a,b,c", "--mnk"), ("two", "128,128", "--mnk"),
                              ("negative", "-5,128,64", "-5"), ("zero", "0,0,0", "--mnk"),
                              ("float", "1e3,128,64", "1e3"), ("four", "128,128,64,1", "--mnk"),
                              ("huge", "99999999999,128,64", "99999999999"),
                              ("n_12", "128,12,64", "12"), ("unicode", "１２８,128,64", "--mnk"),
                              ("spaces", "128, 128, 64", "--mnk"), ("empty", "", "--mnk"),
                              ("x_sep", "128x128x64", "--mnk")):
        expect = "either" if what in valid else "error"
        add(cli(f"cli.build.mnk_{what}", "cli", "build", "v1", "--mnk", mnk, needles=[needle],
                timeout=120, expect=expect))
        add(cli(f"cli.trace.mnk_{what}", "cli", "trace", "v4", "--mnk", mnk,
                needles=[] if what in valid else [needle], expect=expect))
    for flag, value in (("--jobs", "0"), ("--jobs", "-1"), ("--jobs", "abc"),
                        ("--watchdog-ms", "-5"), ("--watchdog-ms", "abc"),
                        ("--watchdog-ms", "1e12"), ("--dtype", "float32"), ("--arch", "sm_80")):
        slug = "".join(ch if ch.isalnum() else "_" for ch in value)
        add(cli(f"cli.build.{flag[2:]}_{slug}", "cli", "build", "v99", flag, value,
                needles=[flag if flag != "--dtype" else value]))
    # choose
    for what, arg, needles in (("letters", "a,b,c", ["a,b,c"]), ("negative", "-5,8,8", ["M"]),
                               ("zero", "0,4096,4096", ["M"]), ("two", "128,4096", ["128,4096"]),
                               ("n_12", "128,12,4096", ["N=12"]),
                               ("huge", "99999999999999,4096,4096", ["M"]),
                               ("float", "128.5,4096,4096", ["128.5"]),
                               ("empty", "", ["M,N,K"]), ("unicode_digits", "١٢٨,4096,4096",
                                                         ["4096"])):
        add(cli(f"cli.choose.{what}", "cli", "choose", arg, needles=needles,
                expect="either" if what == "unicode_digits" else "error"))
    add(cli("cli.choose.ok", "cli", "choose", "128,4096,4096", expect="work"))
    add(cli("cli.choose.bf16_blackwell", "cli", "choose", "128,4096,4096", "--dtype",
            "bfloat16", "--arch", "sm_100a", expect="work"))
    for what, args, needles in (("sm_0", ["--sm-count", "0"], ["--sm-count"]),
                                ("sm_neg", ["--sm-count", "-3"], ["--sm-count"]),
                                ("sm_abc", ["--sm-count", "abc"], ["--sm-count"]),
                                ("card_bogus", ["--card", "h300"], ["h300"]),
                                ("dtype_fp8", ["--dtype", "fp8"], ["fp8"])):
        add(cli(f"cli.choose.{what}", "cli", "choose", "128,4096,4096", *args, needles=needles))
    # show: conflicting flags
    add(cli("cli.show.cuda_and_sass", "cli", "show", "v1", "--cuda", "--sass",
            needles=["--sass"]))
    # export: output folder and suite files
    add(cli("cli.export.out_is_file", "cli", "export", "--suite", "{T}/s.json", "--arch",
            "sm_90a", "--out", "{T}/f", needles=["{T}/f"], files={"f": "x", "s.json": _suite()},
            unchanged=("f",)))
    add(cli("cli.export.out_uncreatable", "cli", "export", "--suite", "{T}/s.json", "--arch",
            "sm_90a", "--out", "/proc/sweep/b", needles=["/proc/sweep"],
            files={"s.json": _suite()}, timeout=90))
    add(cli("cli.export.out_proc", "cli", "export", "v99", "--out", "/proc/b", needles=["v99"]))
    for what, content, needles in SUITE_FILES:
        if what != "unicode_names":  # a valid suite: export would build it (minutes)
            add(cli(f"cli.export.suite_{what}", "cli", "export", "--suite", "{T}/s.json",
                    "--arch", "sm_90a", "--out", "{T}/b", needles=needles,
                    files={"s.json": content}, absent=("b",), timeout=40))
        add(cli(f"cli.bench.suite_{what}", "cli", "bench", "--suite", "{T}/s.json", "--arch",
                "sm_90a", needles=needles, files={"s.json": content}))
    add(cli("cli.export.suite_missing", "cli", "export", "--suite", "{T}/nope.json", "--arch",
            "sm_90a", "--out", "{T}/b", needles=["nope.json"], absent=("b",)))
    add(cli("cli.export.suite_is_dir", "cli", "export", "--suite", "{T}", "--arch", "sm_90a",
            "--out", "{T}/b", needles=["{T}"], absent=("b",)))
    add(cli("cli.export.suite_symlink_loop", "cli", "export", "--suite", "{T}/loop.json",
            "--arch", "sm_90a", "--out", "{T}/b", needles=["loop.json"],
            setup=("symlink_loop:loop.json",), absent=("b",)))
    add(cli("cli.export.suite_fifo", "cli", "export", "--suite", "{T}/pipe.json", "--arch",
            "sm_90a", "--out", "{T}/b", needles=["pipe.json"], setup=("fifo:pipe.json",),
            absent=("b",), timeout=30))
    add(cli("cli.export.target_bogus", "cli", "export", "--suite", "--arch", "sm_90a",
            "--target", "bogus", "--out", "{T}/b", needles=["bogus"], absent=("b",)))
    add(cli("cli.export.num_sms_0", "cli", "export", "--suite", "--arch", "sm_90a",
            "--num-sms", "0", "--out", "{T}/b", needles=["--num-sms"], absent=("b",)))
    add(cli("cli.export.num_sms_abc", "cli", "export", "--suite", "--arch", "sm_90a",
            "--num-sms", "abc", "--out", "{T}/b", needles=["--num-sms"], absent=("b",)))
    add(cli("cli.export.ffi_wheel_27", "cli", "export", "--suite", "--arch", "sm_90a",
            "--ffi-wheel", "2.7", "--out", "{T}/b", needles=["2.7"], absent=("b",)))
    add(cli("cli.export.ffi_wheel_abc", "cli", "export", "--suite", "--arch", "sm_90a",
            "--ffi-wheel", "abc", "--out", "{T}/b", needles=["abc"], absent=("b",)))
    add(cli("cli.export.shapes_bogus", "cli", "export", "v4", "--arch", "sm_90a", "--shapes",
            "bogus", "--out", "{T}/b", needles=["bogus"], absent=("b",)))
    add(cli("cli.export.suite_and_step", "cli", "export", "--suite", "--arch", "sm_90a", "v4",
            "--out", "{T}/b", needles=["step"], absent=("b",)))
    # run / bench / trace / regress on a machine without a GPU, and their files
    add(cli("cli.run.no_gpu", "cli", "run", "v4", "--arch", "sm_90a", needles=["GPU"]))
    add(cli("cli.run.bundle_missing", "cli", "run", "v4", "--bundle", "{T}/nope",
            needles=["{T}/nope"]))
    add(cli("cli.run.bundle_is_file", "cli", "run", "v4", "--bundle", "{T}/f",
            files={"f": "x"}, needles=["{T}/f"]))
    add(cli("cli.run.sha_without_bundle", "cli", "run", "v4", "--expect-sha256", "0" * 64,
            needles=["--expect-sha256", "--bundle"]))
    add(cli("cli.bench.sha_without_bundle", "cli", "bench", "v4", "--expect-sha256", "0" * 64,
            needles=["--expect-sha256", "--bundle"]))
    add(cli("cli.run.sha_bad", "cli", "run", "v4", "--bundle", "{T}", "--expect-sha256", "xyz",
            needles=["xyz"], files={"manifest.json": "{}"}))
    add(cli("cli.run.results_uncreatable", "cli", "run", "v4", "--record", "--results",
            "/proc/sweep/r", needles=["GPU"]))
    add(cli("cli.trace.ctas_0", "cli", "trace", "v4", "--ctas", "0", needles=[]))
    add(cli("cli.trace.ctas_abc", "cli", "trace", "v4", "--ctas", "abc", needles=["--ctas"]))
    add(cli("cli.trace.step_bogus", "cli", "trace", "v99", needles=["v99"]))
    add(cli("cli.trace.out_uncreatable", "cli", "trace", "v4", "--out", "/proc/sweep/t.json",
            needles=["GPU"]))
    for what, content, needles in JSON_FILES:
        add(cli(f"cli.trace.file_{what}", "cli", "trace", "{T}/t.json", needles=needles,
                files={"t.json": content}))
        add(cli(f"cli.regress.expectations_{what}", "cli", "regress", "--cpu",
                "--expectations", "{T}/e.json", needles=needles, files={"e.json": content},
                timeout=120))
        add(cli(f"cli.regress.update_{what}", "cli", "regress", "--cpu", "--update",
                "--expectations", "{T}/e.json", needles=needles, files={"e.json": content},
                unchanged=("e.json",), timeout=120))
        add(cli(f"cli.regress.baseline_{what}", "cli", "regress", "--baseline", "{T}/b.json",
                needles=needles, files={"b.json": content}))
    for what, value in (("neg", "-1"), ("abc", "abc"), ("nan", "nan"), ("inf", "inf")):
        add(cli(f"cli.regress.tolerance_{what}", "cli", "regress", "--tolerance", value,
                needles=["--tolerance"]))
    add(cli("cli.regress.expectations_missing", "cli", "regress", "--cpu", "--expectations",
            "{T}/nope.json", needles=["nope.json"]))
    # bundle DIR
    for what, files, setup, needles in BUNDLES:
        add(cli(f"cli.bundle.{what}", "cli", "bundle", "{T}/b", needles=needles, files=files,
                setup=setup))
    add(cli("cli.bundle.sha_bad", "cli", "bundle", "{T}/b", "--expect-sha256", "123",
            needles=["123"], files={"b/manifest.json": "{}"}))
    add(cli("cli.bundle.wheels_missing_dir", "cli", "bundle", "{T}/nope", "--wheels",
            needles=["{T}/nope"]))
    # sim
    for what, args, needles in (("step_bogus", ["v99"], ["v99"]),
                                ("hopper_step", ["v4"], ["v4"]),
                                ("mnk_letters", ["v1", "--mnk", "a,b,c"], ["--mnk"]),
                                ("seed_abc", ["v1", "--seed", "abc"], ["--seed"]),
                                ("check_bogus", ["v1", "--check", "bogus"], ["bogus"]),
                                ("mutant_bogus", ["v1", "--mutant", "bogus"], ["bogus"]),
                                ("jobs_0", ["v1", "--jobs", "0"], ["--jobs"]),
                                ("log_uncreatable", ["v99", "--log", "/proc/sweep/x.log"], ["v99"]),
                                ("dtype_fp8", ["v1", "--dtype", "fp8"], ["fp8"])):
        # NumSim needs Python 3.12: on this 3.11 checkout that is the first thing to say,
        # except where argparse refuses the flag first
        add(cli(f"cli.sim.{what}", "cli", "sim", *args, timeout=90,
                needles=needles if what in ("seed_abc", "jobs_0", "dtype_fp8") else []))
    add(cli("cli.doctor", "cli", "doctor", expect="either", timeout=120))
    # the scripts a user runs
    sh = [sys.executable]
    add(Case(id="script.render_results.string_clocks", group="scripts", kind="sh",
             argv=[*sh, "scripts/render_results.py", "--results", "{T}/r", "--readme",
                   "{T}/README.md", "--page", "{T}/p.md", "--print"],
             files={"r/x.jsonl": json.dumps({"step": "v1", "arch": "sm_100a", "M": 128,
                                             "N": 128, "K": 64, "device": "H200",
                                             "clocks": "fast", "tflops": 1.0, "verified": True,
                                             "timestamp": "2026-12-01T00:00:00+00:00"}) + "\n"},
             needles=["clocks"], expect="error"))
    add(Case(id="script.render_results.dir_named_jsonl", group="scripts", kind="sh",
             argv=[*sh, "scripts/render_results.py", "--results", "{T}/r", "--readme",
                   "{T}/README.md", "--page", "{T}/p.md", "--print"],
             setup=("mkdir:r/x.jsonl",), needles=["x.jsonl"], expect="error"))
    add(Case(id="script.render_results.empty_folder", group="scripts", kind="sh",
             argv=[*sh, "scripts/render_results.py", "--results", "{T}/r", "--readme",
                   "{T}/README.md", "--page", "{T}/p.md"],
             setup=("mkdir:r",), files={"README.md": "keep\n"}, needles=["{T}/r"],
             unchanged=("README.md",), expect="error"))
    add(Case(id="script.render_results.binary_line", group="scripts", kind="sh",
             argv=[*sh, "scripts/render_results.py", "--results", "{T}/r", "--print"],
             files={"r/x.jsonl": b"\xff\xfe\x00garbage\n"}, needles=["x.jsonl"]))
    add(Case(id="script.old_trace_png_entry", group="scripts", kind="sh",
             argv=[*sh, "-m", "tirx_gemm.run.trace", "png", "{T}/t.json"],
             files={"t.json": "{}"}, needles=["trace"], expect="either"))
    return out


def _suite(**change) -> str:
    s = {"name": "s", "description": "d", "dtypes": ["float16"],
         "shapes": [{"M": 128, "N": 4096, "K": 4096, "model": "m", "layer": "l", "why": "w"}]}
    s.update(change)
    return json.dumps(s)


SUITE_FILES = [
    ("empty", "", ["s.json"]),
    ("binary", "\x00\x01\x02\xff", ["s.json"]),
    ("list", "[1, 2, 3]", ["s.json"]),
    ("string", '"models"', ["s.json"]),
    ("shapes_int", _suite(shapes=5), ["shapes"]),
    ("shapes_empty", _suite(shapes=[]), ["shapes"]),
    ("no_shapes", json.dumps({"name": "s", "dtypes": ["float16"]}), ["shapes"]),
    ("m_negative", _suite(shapes=[{"M": -1, "N": 4096, "K": 4096, "model": "m", "layer": "l",
                                   "why": "w"}]), ["M"]),
    ("m_huge", _suite(shapes=[{"M": 2 ** 40, "N": 4096, "K": 4096, "model": "m",
                               "layer": "l", "why": "w"}]), ["M"]),
    ("m_string", _suite(shapes=[{"M": "128", "N": 4096, "K": 4096, "model": "m",
                                 "layer": "l", "why": "w"}]), ["M"]),
    ("n_12", _suite(shapes=[{"M": 128, "N": 12, "K": 4096, "model": "m", "layer": "l",
                             "why": "w"}]), ["N"]),
    ("dtype_bad", _suite(dtypes=["float32"]), ["float32"]),
    ("dtypes_string", _suite(dtypes="float16"), ["dtypes"]),
    ("unicode_names", _suite(name="смесь ✓", shapes=[{"M": 128, "N": 4096, "K": 4096,
                                                      "model": "モデル", "layer": "層",
                                                      "why": "w"}]), []),
    ("unknown_key", _suite(shaeps=[]), ["shaeps"]),
    ("entry_unknown_key", _suite(shapes=[{"M": 128, "N": 4096, "K": 4096, "model": "m",
                                          "layer": "l", "why": "w", "dtpye": "bf16"}]),
     ["dtpye"]),
    ("float_m", _suite(shapes=[{"M": 128.0, "N": 4096, "K": 4096, "model": "m", "layer": "l",
                                "why": "w"}]), ["M"]),
    ("deep", "[" * 100000 + "]" * 100000, ["deep"]),
    ("trailing_garbage", _suite() + "}", ["s.json"]),
    ("bom", "\ufeff" + _suite(), ["s.json"]),
]

JSON_FILES = [
    ("empty", "", []),
    ("binary", "\x00\xff\xfe", []),
    ("list", "[1, 2]", []),
    ("string", '"x"', []),
    ("deep", "[" * 100000 + "]" * 100000, []),
    ("wrong_schema", json.dumps({"v1": "fast"}), []),
]

BUNDLES = [
    ("missing", {}, (), ["{T}/b"]),
    ("empty_dir", {}, ("mkdir:b",), ["{T}/b"]),
    ("manifest_empty", {"b/manifest.json": ""}, (), ["manifest.json"]),
    ("manifest_binary", {"b/manifest.json": b"\xff\xd8\xff"}, (), ["manifest.json"]),
    ("manifest_list", {"b/manifest.json": "[]"}, (), ["manifest.json"]),
    ("manifest_no_files", {"b/manifest.json": json.dumps({"kernels": []})}, (),
     ["manifest.json"]),
    ("manifest_old_format", {"b/manifest.json": json.dumps({"kernels": [], "files": {}})}, (),
     ["manifest.json"]),
    ("manifest_kernel_str", {"b/manifest.json": json.dumps(
        {"format": 2, "kernels": ["x"], "files": {}})}, (), ["manifest.json"]),
    ("manifest_lib_missing", {"b/manifest.json": json.dumps(
        {"format": 2, "kernels": [{"step": "v4", "arch": "sm_90a", "lib": "k.so", "M": 128,
                                   "N": 128, "K": 64}], "files": {"k.so": "0" * 64}})}, (),
     ["k.so"]),
    ("manifest_lib_escape", {"b/manifest.json": json.dumps(
        {"format": 2, "kernels": [{"step": "v4", "arch": "sm_90a", "lib": "../k.so"}],
         "files": {"../k.so": "0" * 64}})}, (), ["../k.so"]),
    ("manifest_lib_absolute", {"b/manifest.json": json.dumps(
        {"format": 2, "kernels": [{"step": "v4", "arch": "sm_90a", "lib": "/etc/passwd"}],
         "files": {"/etc/passwd": "0" * 64}})}, (), ["/etc/passwd"]),
    ("manifest_format_string", {"b/manifest.json": json.dumps(
        {"format": "2", "kernels": [], "files": {}})}, (), ["manifest.json"]),
    ("manifest_is_dir", {}, ("mkdir:b/manifest.json",), ["manifest.json"]),
    ("manifest_symlink_loop", {}, ("mkdir:b", "symlink_loop:b/manifest.json"),
     ["manifest.json"]),
    ("manifest_deep", {"b/manifest.json": "{\"kernels\":" + "[" * 100000 + "]" * 100000 + "}"},
     (), ["manifest.json"]),
    ("is_file", {"b": "x"}, (), ["{T}/b"]),
    ("stray_runtime", {"b/manifest.json": json.dumps({"format": 2, "kernels": [], "files": {}}),
                       "b/runtime/libx.so": "x"}, (), ["runtime"]),
]


# --------------------------------------------------------------------------------------
# bundles and the build cache from Python
# --------------------------------------------------------------------------------------
def bundle_cache_cases():
    out = []
    for what, files, setup, needles in BUNDLES:
        out.append(Case(id=f"use_bundle.{what}", group="bundles and caches", kind="py",
                        code="from tirx_gemm import matmul as mm\nmm.use_bundle(T + '/b')\n",
                        files=files, setup=setup, needles=tuple(needles)))
        out.append(Case(id=f"env_bundle.{what}", group="bundles and caches", kind="py",
                        code=HEAD + "_real = mm._load\nemulate()\nmm._load = _real\n"
                             "mm.matmul(a, b)\n",
                        files=files, setup=setup, needles=("{T}/b",),
                        env={"TIRX_GEMM_BUNDLE": "{T}/b"}))
    out.append(Case(id="use_bundle.int", group="bundles and caches", kind="py",
                    code="from tirx_gemm import matmul as mm\nmm.use_bundle(5)\n",
                    needles=("5",)))
    out.append(Case(id="use_bundle.empty_string", group="bundles and caches", kind="py",
                    code="from tirx_gemm import matmul as mm\nmm.use_bundle('')\n",
                    needles=("bundle",)))
    for what, value, setup, files in (
            ("is_file", "{T}/f", (), {"f": "x"}),
            ("uncreatable", "/proc/sweep/c", (), {}),
            ("tilde_user", "~nosuchuser/c", (), {}),
            ("dangling_symlink", "{T}/d", ("dangling:d",), {})):
        out.append(Case(id=f"cache.{what}", group="bundles and caches", kind="py",
                        code="from tirx_gemm import registry\n"
                             "from tirx_gemm.kernels import kernel_for\n"
                             "kernel_for(registry.get('v1', 'sm_100a'), (128, 128, 64))\n",
                        env={"TIRX_GEMM_CACHE": value}, setup=setup, files=files,
                        needles=("TIRX_GEMM_CACHE",), expect="error"))
        out.append(cli(f"cli.cache.{what}", "bundles and caches", "build", "v1", "--mnk",
                       "128,128,64", env={"TIRX_GEMM_CACHE": value}, setup=setup, files=files,
                       needles=["TIRX_GEMM_CACHE"], timeout=120))
    return out


# --------------------------------------------------------------------------------------
# the op library's newer parts: backward (op/autograd.py), grouped GEMM, MoE, fp8 layers
# --------------------------------------------------------------------------------------
AUTOGRAD_HEAD = HEAD + """from tirx_gemm.op import autograd as ag
torch.Tensor.get_device = lambda self: 0 if self.device.type == 'cpu' else -1
"""

AUTOGRAD = [
    ("set_step_int", "ag.set_backward_step(5)", "error", ["5"]),
    ("set_step_bogus", "ag.set_backward_step('v99')", "error", ["v99"]),
    ("set_step_v9", "ag.set_backward_step('v9')", "either", ["v9"]),
    ("fp8_requires_grad", "ag.check_trainable(a=a.to(torch.float8_e4m3fn).float()"
                          ".to(torch.float8_e4m3fn).requires_grad_())", "error", ["float8"]),
    ("linear_wrong_k", "ag.linear(a.requires_grad_(), torch.randn(N, 72).half())", "error",
     ["72"]),
    ("linear_3d_weight", "ag.linear(a, b.view(2, 64, K))", "error", ["2-D"]),
    ("linear_bias_wrong", "ag.linear(a, b, torch.zeros(N + 8).half())", "error", ["bias"]),
    ("matmul_none", "ag.matmul(None, b)", "error", ["a"]),
    ("matmul_fp32_grad", "ag.matmul(a.float().requires_grad_(), b.float())", "error",
     ["float32"]),
    ("main_grad_fp16", "w = torch.nn.Parameter(b.clone())\nw.main_grad = torch.zeros(N, K)"
                       ".half()\ny = ag.matmul(a.requires_grad_(), w)\ny.sum().backward()",
     "error", ["main_grad"]),
    ("main_grad_shape", "w = torch.nn.Parameter(b.clone())\nw.main_grad = torch.zeros(K, N)\n"
                        "y = ag.matmul(a.requires_grad_(), w)\ny.sum().backward()", "error",
     ["main_grad"]),
    ("double_backward", "A = a.clone().requires_grad_()\ny = ag.matmul(A, b)\n"
                        "g, = torch.autograd.grad(y.float().sum(), A, create_graph=True)\n"
                        "g.float().sum().backward()", "error", ["create_graph"]),
    ("swiglu_concatenated", "A = a.clone().requires_grad_()\n"
                            "ag.swiglu(A, torch.cat([b, b]).requires_grad_())", "error",
     ["fuse_gate_up"]),
]


def autograd_cases():
    out = [py(f"autograd.{w}", "backward", AUTOGRAD_HEAD.replace(HEAD, "") + c + "\n", e, n)
           for w, c, e, n in AUTOGRAD]
    out.append(py("autograd.works.matmul_grads", "backward", """from tirx_gemm.op import autograd as ag
torch.Tensor.get_device = lambda self: 0 if self.device.type == 'cpu' else -1
A = a.clone().requires_grad_(); B = b.clone().requires_grad_()
y = ag.matmul(A, B)
y.float().sum().backward()
A2 = a.float().clone().requires_grad_(); B2 = b.float().clone().requires_grad_()
(A2 @ B2.T).sum().backward()
ok(close(A.grad, A2.grad), 'da differs from torch')
ok(close(B.grad, B2.grad, 5e-2), 'db differs from torch')
""", "work"))
    out.append(py("autograd.works.linear_bias_grads", "backward", """from tirx_gemm.op import autograd as ag
torch.Tensor.get_device = lambda self: 0 if self.device.type == 'cpu' else -1
A = a.clone().requires_grad_(); B = b.clone().requires_grad_(); c = torch.randn(N).half().requires_grad_()
y = ag.linear(A, B, c)
y.float().sum().backward()
ok(c.grad is not None and close(c.grad, torch.full((N,), float(M))), 'dbias')
""", "work"))
    return out


def _module_exists(rel: str) -> bool:
    return (ROOT / rel).is_file()


def generic_probes(module: str, names):
    """What a new user tries first on a new module: each public function with no
    arguments, None, a CPU fp32 tensor, a list, and keywords it does not take."""
    out = []
    for name in names:
        for what, args in (("no_args", ""), ("none", "None"), ("fp32", "a.float()"),
                           ("list", "[a, b]"), ("bogus_kw", "a, b, bogus=1"),
                           ("int", "5")):
            out.append(py(f"{module.split('.')[-1]}.{name}.{what}", "new parts",
                          f"import importlib\nmod = importlib.import_module({module!r})\n"
                          f"mod.{name}({args})\n", "error", [], torch_ok=False))
    return out


def new_parts():
    """Cases for the modules of the op library that landed while this study ran (each
    group only where its file exists): backward, grouped GEMM, MoE, fp8 and parallel
    layers, and the generic probes of every public function they export."""
    import importlib
    import inspect
    out = []
    if _module_exists("tirx_gemm/op/autograd.py"):
        out += autograd_cases()
    for rel, module in (("tirx_gemm/op/grouped.py", "tirx_gemm.op.grouped"),
                        ("tirx_gemm/op/moe.py", "tirx_gemm.op.moe"),
                        ("tirx_gemm/op/fp8_nn.py", "tirx_gemm.op.fp8_nn"),
                        ("tirx_gemm/op/parallel.py", "tirx_gemm.op.parallel")):
        if not _module_exists(rel):
            continue
        try:
            mod = importlib.import_module(module)
            names = [n for n in getattr(mod, "__all__", [])
                     if inspect.isfunction(getattr(mod, n, None))
                     and n != "world"]  # world(): (0, 1) without torch.distributed, by design
        except Exception:  # noqa: BLE001 -- an import failure is itself a case below
            names = []
        out.append(py(f"{module.split('.')[-1]}.import", "new parts",
                      f"import importlib\nimportlib.import_module({module!r})\n", "work"))
        out += generic_probes(module, names)
    if all(_module_exists(f"tirx_gemm/op/{m}.py") for m in ("grouped", "moe", "fp8_nn",
                                                             "parallel")):
        import catalogue_new
        out += catalogue_new.cases()
    return out


def cases(which: str = "all") -> list[Case]:
    core = (matmul_operands() + matmul_keywords() + swiglu() + choose_explain() + fp8_cases()
            + nn_cases() + settings_cases() + cli_cases() + bundle_cache_cases())
    out = core if which == "core" else core + new_parts()
    ids = [c.id for c in out]
    dup = {i for i in ids if ids.count(i) > 1}
    if dup:
        raise ValueError(f"duplicate case ids: {sorted(dup)[:5]}")
    return out
