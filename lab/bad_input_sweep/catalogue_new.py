"""The catalogue's cases for the op library's newer parts: grouped GEMM (op/grouped.py) and its
fp8 form (op/grouped_fp8.py: e4m3 operands with block scales), the MoE layer (op/moe.py), fp8 layers (op/fp8_nn.py) and tensor-parallel layers (op/parallel.py).
The same classes of input as the core catalogue: wrong types, dtypes, shapes, layouts,
keywords, an overlapping ``out``, a fused weight of the wrong layout, and valid calls whose
answer is compared with torch."""
from __future__ import annotations

from catalogue import HEAD, py

REF_GROUPED = """def ref_grouped(a, w, offs):
    out = torch.zeros(a.shape[0], w.shape[1])
    start = 0
    for e in range(w.shape[0]):
        end = int(offs[e])
        out[start:end] = a[start:end].float() @ w[e].float().T
        start = end
    return out
"""

GROUPED_HEAD = HEAD + """from tirx_gemm.op import grouped as G, grouped_swiglu as GS
E, T = 4, 16
offs = torch.tensor([16, 40, 40, 64], dtype=torch.int32)
w = torch.randn(E, N, K).half() / 8          # stacked (E, N, K) Linear weights
bt = w.transpose(1, 2)                      # torch's (E, K, N) view
""" + REF_GROUPED

GROUPED = [
    ("a_none", "G.grouped_mm(None, bt, offs)", "error", ["a"]),
    ("b_2d", "G.grouped_mm(a, b, offs)", "error", ["b", "3-D"]),
    ("a_float32", "G.grouped_mm(a.float(), bt.float(), offs)", "error", ["float32"]),
    ("mixed_dtypes", "G.grouped_mm(a, bt.bfloat16(), offs)", "error", ["bfloat16"]),
    ("offs_int64", "G.grouped_mm(a, bt, offs.long())", "error", ["offs", "int64"]),
    ("offs_float", "G.grouped_mm(a, bt, offs.float())", "error", ["offs"]),
    ("offs_list", "G.grouped_mm(a, bt, [16, 40, 40, 64])", "error", ["offs", "list"]),
    ("offs_wrong_len", "G.grouped_mm(a, bt, offs[:3])", "error", ["offs"]),
    ("offs_2d", "G.grouped_mm(a, bt, offs.view(2, 2))", "error", ["offs"]),
    ("offs_missing", "G.grouped_mm(a, bt)", "error", ["offs"]),
    ("offs_and_counts", "G.grouped_mm(a, bt, offs, counts=offs)", "error", ["counts"]),
    ("offs_decreasing", "G.grouped_mm(a, bt, torch.tensor([40, 16, 64, 64], dtype=torch.int32))",
     "either", ["offs"]),
    ("offs_past_m", "G.grouped_mm(a, bt, torch.tensor([16, 40, 40, 99], dtype=torch.int32))",
     "either", ["offs"]),
    ("offs_decreasing_checked", "import os\nos.environ['TIRX_GEMM_CHECK'] = '1'\n"
     "G.grouped_mm(a, bt, torch.tensor([40, 16, 64, 64], dtype=torch.int32))", "error",
     ["offs"]),
    ("k_mismatch", "G.grouped_mm(torch.randn(M, 72).half(), bt, offs)", "error", ["72"]),
    ("n_12", "G.grouped_mm(a, torch.randn(E, K, 12).half(), offs)", "error", ["12"]),
    ("e_too_many", "G.grouped_mm(a, torch.randn(300, K, N).half(), "
                   "torch.full((300,), 64, dtype=torch.int32))", "error", ["300"]),
    ("a_3d_with_offs", "G.grouped_mm(a.view(E, T, K), bt, offs)", "error", ["offs"]),
    ("a_transposed", "G.grouped_mm(torch.randn(K, M).half().t(), bt, offs)", "error",
     ["contiguous"]),
    ("a_requires_grad", "G.grouped_mm(a.requires_grad_(), bt, offs)", "error", ["grad"]),
    ("a_sparse", "G.grouped_mm(a.to_sparse(), bt, offs)", "error", ["to_dense"]),
    ("bias_wrong", "G.grouped_mm(a, bt, offs, bias=torch.zeros(E, N + 8).half())", "error",
     ["bias"]),
    ("bias_int", "G.grouped_mm(a, bt, offs, bias=torch.zeros(E, N, dtype=torch.int32))",
     "error", ["bias"]),
    ("scale_wrong", "G.grouped_mm(a, bt, offs, scale=torch.ones(M + 1))", "error", ["scale"]),
    ("scale_2d", "G.grouped_mm(a, bt, offs, scale=torch.ones(M, 1))", "error", ["scale"]),
    ("out_dtype_fp32", "G.grouped_mm(a, bt, offs, out_dtype=torch.float32)", "error",
     ["out_dtype"]),
    ("out_wrong_shape", "G.grouped_mm(a, bt, offs, out=torch.empty(M, N + 8).half())", "error",
     ["out"]),
    ("out_overlaps_a", "buf = torch.empty(M * K + M * N).half()\nA = buf[:M * K].view(M, K)\n"
                       "A.copy_(a)\nG.grouped_mm(A, bt, offs, out=buf[8 * K:8 * K + M * N]"
                       ".view(M, N))", "error", ["overlaps"]),
    ("out_overlaps_offs", "o = torch.empty(M, N).half()\n"
                          "G.grouped_mm(a, bt, o.view(torch.int32).view(-1)[:E], out=o)",
     "error", ["overlaps"]),
    ("layout_bogus", "G.grouped_mm(a, bt, offs, layout='ragged')", "error", ["ragged"]),
    ("layout_masked_2d", "G.grouped_mm(a, bt, counts=offs, layout='masked')", "error",
     ["masked"]),
    ("counts_past_t", "G.grouped_mm(a.view(E, T, K), bt, counts=torch.full((E,), 99, "
                      "dtype=torch.int32), layout='masked')", "either", ["counts"]),
    ("counts_negative_checked", "import os\nos.environ['TIRX_GEMM_CHECK'] = '1'\n"
     "G.grouped_mm(a.view(E, T, K), bt, counts=torch.full((E,), -1, dtype=torch.int32), "
     "layout='masked')", "error", ["counts"]),
    ("step_kw", "G.grouped_mm(a, bt, offs, step='v9')", "error", ["step"]),
    ("fuse_2d", "G.fuse_gate_up_experts(b, b)", "error", ["3-D"]),
    ("fuse_mismatch", "G.fuse_gate_up_experts(w, w[:, :64])", "error", ["w_up"]),
    ("fuse_n_12", "G.fuse_gate_up_experts(w[:, :12], w[:, :12])", "error", ["12"]),
    ("swiglu_concatenated", "wg, wu = torch.randn(E, N, K).half() / 8, torch.randn(E, N, K).half() / 8\n"
                            "GS.grouped_swiglu(a, torch.cat([wg, wu], dim=1), offs)", "error",
     ["fuse_gate_up_experts"]),
    ("swiglu_2d_fused", "GS.grouped_swiglu(a, b, offs)", "error", ["fused"]),
    ("swiglu_odd_rows", "GS.grouped_swiglu(a, torch.randn(E, 24, K).half(), offs)", "error",
     ["24"]),
    ("choose_rows_negative", "G.choose_grouped(-1, 8, 4096, 4096)", "error", ["-1"]),
    ("choose_e_0", "G.choose_grouped(128, 0, 4096, 4096)", "error", ["E"]),
    ("choose_e_huge", "G.choose_grouped(128, 1000, 4096, 4096)", "error", ["1000"]),
    ("choose_n_12", "G.choose_grouped(128, 8, 12, 4096)", "error", ["12"]),
    ("choose_layout_bogus", "G.choose_grouped(128, 8, 4096, 4096, layout='ragged')", "error",
     ["ragged"]),
    ("choose_dtype_torch", "r = G.choose_grouped(128, 8, 4096, 4096, torch.bfloat16)\nok(r, 'empty')",
     "work", []),
    ("choose_arch_sm80", "G.choose_grouped(128, 8, 4096, 4096, arch='sm_80')", "error",
     ["sm_80"]),
    ("explain_float_rows", "G.explain_grouped(12.5, 8, 4096, 4096)", "error", ["12.5"]),
    ("suite_builds_int", "G.suite_builds(5)", "error", ["entry"]),
    ("suite_builds_empty", "G.suite_builds({})", "error", ["E"]),
]

GROUPED_WORKS = {
    "contiguous": "y = G.grouped_mm(a, bt, offs)\nok(close(y, ref_grouped(a, w, offs)), 'values')",
    "linear_convention": "y = G.grouped_mm(a, w, offs)\n"
                         "ok(close(y, ref_grouped(a, w, offs)), 'values of an (E, N, K) b')",
    "empty_expert": "o = torch.tensor([0, 0, 64, 64], dtype=torch.int32)\n"
                    "y = G.grouped_mm(a, bt, o)\nok(close(y, ref_grouped(a, w, o)), 'values')",
    "bias_per_expert": "bias = torch.randn(E, N).half()\ny = G.grouped_mm(a, bt, offs, bias=bias)\n"
                       "r = ref_grouped(a, w, offs)\nowner = torch.searchsorted(offs, "
                       "torch.arange(M, dtype=torch.int32), right=True)\n"
                       "ok(close(y, r + bias.float()[owner]), 'bias values')",
    "scale_rows": "s = torch.rand(M)\ny = G.grouped_mm(a, bt, offs, scale=s)\n"
                  "ok(close(y, ref_grouped(a, w, offs) * s[:, None]), 'scaled values')",
    "masked": "c = torch.tensor([16, 3, 0, 9], dtype=torch.int32)\n"
              "y = G.grouped_mm(a.view(E, T, K), bt, counts=c, layout='masked')\n"
              "for e in range(E):\n"
              "    n = int(c[e])\n"
              "    ok(close(y[e, :n], a.view(E, T, K)[e, :n].float() @ w[e].float().T), "
              "f'expert {e}')",
    "swiglu_fused": "wg, wu = torch.randn(E, N, K).half() / 8, torch.randn(E, N, K).half() / 8\n"
                    "y = GS.grouped_swiglu(a, G.fuse_gate_up_experts(wg, wu), offs)\n"
                    "r = F.silu(ref_grouped(a, wg, offs)) * ref_grouped(a, wu, offs)\n"
                    "ok(close(y, r), 'SwiGLU values')",
}

GROUPED_FP8_HEAD = HEAD + """from tirx_gemm.op import grouped as G, grouped_fp8 as GF
E, T, K8, N8 = 4, 16, 256, 128
offs = torch.tensor([16, 40, 40, 64], dtype=torch.int32)
qa, sa = GF.quantize_rows(torch.randn(M, K8))           # e4m3 (M, K8), scales (M, K8/128)
qw, sw = GF.quantize_experts(torch.randn(E, N8, K8) / 16)  # (E, N8, K8), (E, 1, K8/128)
bt = qw.transpose(1, 2)                                 # torch's (E, K, N) view
def deq(qa, sa, qw, sw):
    a = (qa.float().reshape(qa.shape[0], -1, 128) * sa[:, :, None]).reshape(qa.shape)
    full = sw.repeat_interleave(128, 1)[:, :qw.shape[1]].repeat_interleave(128, 2)
    return a, qw.float() * full
""" + REF_GROUPED

# fp8 grouped_mm's refusals: each before any launch, one line naming the operand and the way out
GROUPED_FP8 = [
    ("k_192", "G.grouped_mm(qa[:, :192].contiguous(), qw[:, :, :192].contiguous().transpose(1, 2), "
              "offs, scale_a=sa, scale_b=sw)", "error", ["K=192", "128"]),
    ("scale_a_missing", "G.grouped_mm(qa, bt, offs, scale_b=sw)", "error", ["scale_a"]),
    ("scale_b_missing", "G.grouped_mm(qa, bt, offs, scale_a=sa)", "error", ["scale_b"]),
    ("scale_a_half", "G.grouped_mm(qa, bt, offs, scale_a=sa.half(), scale_b=sw)", "error",
     ["scale_a", "float32"]),
    ("scale_a_rows", "G.grouped_mm(qa, bt, offs, scale_a=sa[:63].contiguous(), scale_b=sw)",
     "error", ["scale_a", "(64, 2)"]),
    ("scale_a_per_tensor", "G.grouped_mm(qa, bt, offs, scale_a=torch.ones(()), scale_b=sw)",
     "error", ["scale_a", "(64, 2)"]),
    ("scale_b_short", "G.grouped_mm(qa, bt, offs, scale_a=sa, scale_b=sw[:, :, :1].contiguous())",
     "error", ["scale_b", "(4, 1, 2)"]),
    ("scale_a_strided", "G.grouped_mm(qa, bt, offs, scale_a=sa.t().contiguous().t(), "
                        "scale_b=sw)", "error", ["scale_a", "contiguous"]),
    ("b_bf16", "G.grouped_mm(qa, bt.bfloat16(), offs, scale_a=sa, scale_b=sw)", "error",
     ["b", "bfloat16"]),
    ("a_e5m2", "G.grouped_mm(qa.float().to(torch.float8_e5m2), bt, offs, scale_a=sa, "
               "scale_b=sw)", "error", ["float8_e5m2", "float8_e4m3fn"]),
    ("a_fp16_with_scales", "G.grouped_mm(qa.half(), bt, offs, scale_a=sa, scale_b=sw)", "error",
     ["float16", "float8_e4m3fn"]),
    ("b_list", "G.grouped_mm(qa, [qw], offs, scale_a=sa, scale_b=sw)", "error", ["b", "list"]),
    ("offs_int64", "G.grouped_mm(qa, bt, offs.long(), scale_a=sa, scale_b=sw)", "error",
     ["offs", "int64"]),
    ("offs_missing", "G.grouped_mm(qa, bt, scale_a=sa, scale_b=sw)", "error", ["offs"]),
    ("offs_wrong_len", "G.grouped_mm(qa, bt, offs[:3], scale_a=sa, scale_b=sw)", "error",
     ["offs", "(3,)"]),
    ("counts_with_2d_a", "G.grouped_mm(qa, bt, counts=offs, scale_a=sa, scale_b=sw)", "error",
     ["counts"]),
    ("masked_2d_a", "G.grouped_mm(qa, bt, counts=offs, layout='masked', scale_a=sa, "
                    "scale_b=sw)", "error", ["3-D", "masked"]),
    ("masked_experts_mismatch", "G.grouped_mm(qa.view(E, T, K8)[:3], bt, counts=offs, "
                                "scale_a=sa.view(E, T, 2)[:3], scale_b=sw)", "error",
     ["4 experts"]),
    ("layout_bogus", "G.grouped_mm(qa, bt, offs, layout='ragged', scale_a=sa, scale_b=sw)",
     "error", ["ragged"]),
    ("k_mismatch", "G.grouped_mm(qa, torch.zeros(E, 384, N8).to(torch.float8_e4m3fn), offs, "
                   "scale_a=sa, scale_b=sw)", "error", ["K=256"]),
    ("e_300", "G.grouped_mm(qa, torch.zeros(300, K8, 8).to(torch.float8_e4m3fn), offs, "
              "scale_a=sa, scale_b=sw)", "error", ["300"]),
    ("n_12", "G.grouped_mm(qa, torch.zeros(E, K8, 12).to(torch.float8_e4m3fn), offs, "
             "scale_a=sa, scale_b=sw)", "error", ["N=12"]),
    ("a_strided", "G.grouped_mm(qa.view(torch.uint8).t().contiguous().t()"
                  ".view(torch.float8_e4m3fn), bt, offs, scale_a=sa, scale_b=sw)", "error",
     ["a.contiguous()"]),
    ("bias", "G.grouped_mm(qa, bt, offs, scale_a=sa, scale_b=sw, bias=torch.zeros(E, N8))",
     "error", ["bias"]),
    ("row_scale", "G.grouped_mm(qa, bt, offs, scale_a=sa, scale_b=sw, scale=torch.ones(M))",
     "error", ["scale="]),
    ("out_dtype_fp32", "G.grouped_mm(qa, bt, offs, scale_a=sa, scale_b=sw, "
                       "out_dtype=torch.float32)", "error", ["float32"]),
    ("out_wrong_shape", "G.grouped_mm(qa, bt, offs, scale_a=sa, scale_b=sw, "
                        "out=torch.empty(M, N8 + 8, dtype=torch.bfloat16))", "error", ["out"]),
    ("scale_requires_grad", "G.grouped_mm(qa, bt, offs, scale_a=sa.requires_grad_(), "
                            "scale_b=sw)", "error", ["no_grad"]),
    ("choose_rows_negative", "GF.choose_grouped_fp8(-1, 8, 4096, 4096)", "error", ["-1"]),
    ("choose_k_200", "GF.choose_grouped_fp8(128, 8, 4096, 200)", "error", ["K=200"]),
]

GROUPED_FP8_WORKS = {
    "contiguous": "y = G.grouped_mm(qa, bt, offs, scale_a=sa, scale_b=sw)\n"
                  "a, w = deq(qa, sa, qw, sw)\nok(close(y, ref_grouped(a, w, offs)), 'values')",
    "linear_convention": "y = G.grouped_mm(qa, qw, offs, scale_a=sa, scale_b=sw, "
                         "out_dtype=torch.float16)\na, w = deq(qa, sa, qw, sw)\n"
                         "ok(y.dtype == torch.float16, str(y.dtype))\n"
                         "ok(close(y, ref_grouped(a, w, offs)), 'values of an (E, N, K) b')",
    "masked": "c = torch.tensor([16, 3, 0, 9], dtype=torch.int32)\n"
              "y = G.grouped_mm(qa.view(E, T, K8), bt, counts=c, scale_a=sa.view(E, T, 2), "
              "scale_b=sw)\na, w = deq(qa, sa, qw, sw)\na = a.view(E, T, K8)\n"
              "for e in range(E):\n"
              "    n = int(c[e])\n"
              "    ok(close(y[e, :n], a[e, :n] @ w[e].T), f'expert {e}')",
}

MOE_HEAD = HEAD + """from tirx_gemm.op import moe
E, H, I, Tk = 4, 64, 32, 16
torch.Tensor.get_device = lambda self: 0 if self.device.type == 'cpu' else -1
x = torch.randn(Tk, H).half()
idx = torch.randint(0, E, (Tk, 2))
wts = torch.rand(Tk, 2).half()
"""

MOE = [
    ("experts_zero", "moe.Experts(0, H, I)", "error", ["num_experts"]),
    ("experts_float", "moe.Experts(4, 64.0, I)", "error", ["hidden_size"]),
    ("experts_index_out_of_range", "m = moe.Experts(E, H, I).half()\n"
                                   "m(x, torch.full((Tk, 2), 7), wts)", "error",
     ["top_k_index"]),
    ("experts_index_negative", "m = moe.Experts(E, H, I).half()\n"
                               "m(x, torch.full((Tk, 2), -1), wts)", "error", ["top_k_index"]),
    ("experts_index_float", "m = moe.Experts(E, H, I).half()\nm(x, idx.float(), wts)", "error",
     ["top_k_index"]),
    ("experts_weights_shape", "m = moe.Experts(E, H, I).half()\nm(x, idx, wts[:, :1])", "error",
     ["top_k_weights"]),
    ("experts_tokens_mismatch", "m = moe.Experts(E, H, I).half()\nm(x[:8], idx, wts)", "error",
     ["top_k_index"]),
    ("experts_hidden_mismatch", "m = moe.Experts(E, H, I).half()\n"
                                "m(torch.randn(Tk, 72).half(), idx, wts)", "error", ["72"]),
    ("experts_index_1d", "m = moe.Experts(E, H, I).half()\nm(x, idx[:, 0], wts[:, 0])", "error",
     ["top_k_index"]),
    ("experts_strict_cpu", "m = moe.Experts(E, H, I, strict=True).half()\nm(x, idx, wts)",
     "error", ["strict"]),
    ("patch_moe_none", "moe.patch_moe(None)", "error", ["Module"]),
    ("patch_moe_int", "moe.patch_moe(5)", "error", ["Module"]),
    ("from_module_linear", "moe.Experts.from_module(torch.nn.Linear(8, 8))", "error",
     ["Linear"]),
    ("permute_float", "moe.permute(idx.float(), E)", "error", ["top_k_index"]),
    ("permute_out_of_range", "moe.permute(torch.full((Tk, 2), 9), E)", "error", ["9"]),
    ("permute_e_0", "moe.permute(idx, 0)", "error", ["num_experts"]),
    ("op_concat_eager", "moe.grouped_mm(torch.randn(64, 64).half(), torch.randn(4, 64, 128)"
                        ".half(), [16, 40, 40, 64])", "error", ["offs"]),
]

MOE_WORKS = {
    "fallback_matches_reference": """
m = moe.Experts(E, H, I).half()
y = m(x, idx, wts)
ref = torch.zeros(Tk, H)
for t in range(Tk):
    for j in range(2):
        e = int(idx[t, j])
        g, u = m.gate_up_proj[e].float().chunk(2, dim=0)
        h = F.silu(x[t].float() @ g.T) * (x[t].float() @ u.T)
        ref[t] += float(wts[t, j]) * (h @ m.down_proj[e].float().T)
ok(close(y, ref, 5e-2), 'MoE values differ from the per-token reference')
ok(m.fallbacks == 1, f'fallbacks {m.fallbacks}')
""",
    "kernel_path_matches_fallback": """
m = moe.Experts(E, H, I).half()
with torch.no_grad():
    ref = m(x, idx, wts)
    m._refusal = lambda x: None
    y = m(x, idx, wts)
ok(close(y, ref, 5e-2), 'the grouped path differs from the fallback')
""",
    "patch_moe_nothing_to_do": """
rep = moe.patch_moe(torch.nn.Sequential(torch.nn.Linear(8, 8)))
ok(not rep.replaced, f'replaced {rep.replaced}')
""",
}

FP8NN_HEAD = HEAD + """from tirx_gemm.op import fp8_nn, fp8
E4 = torch.float8_e4m3fn
x = torch.randn(4, 128).bfloat16()
"""

FP8NN = [
    ("linear_scale_bogus", "fp8_nn.Fp8Linear(128, 128, scale='channel')", "error", ["channel"]),
    ("linear_out_dtype_fp32", "fp8_nn.Fp8Linear(128, 128, out_dtype=torch.float32)", "error",
     ["out_dtype"]),
    ("linear_in_12", "fp8_nn.Fp8Linear(12, 128)", "error", ["12"]),
    ("linear_block_k_200", "fp8_nn.Fp8Linear(208, 128, scale='block')", "error", ["208"]),
    ("linear_negative", "fp8_nn.Fp8Linear(-16, 128)", "error", ["-16"]),
    ("linear_float_features", "fp8_nn.Fp8Linear(128.0, 128)", "error", ["128.0"]),
    ("from_linear_bogus_scale", "fp8_nn.Fp8Linear.from_linear(torch.nn.Linear(128, 128), "
                                "scale='bogus')", "error", ["bogus"]),
    ("from_linear_int", "fp8_nn.Fp8Linear.from_linear(5)", "error", ["Linear"]),
    ("from_linear_odd", "fp8_nn.Fp8Linear.from_linear(torch.nn.Linear(12, 128))", "error",
     ["12"]),
    ("from_checkpoint_e5m2", "fp8_nn.Fp8Linear.from_checkpoint(torch.zeros(128, 128)"
                             ".to(torch.float8_e5m2), torch.ones(128))", "error", ["e5m2"]),
    ("from_checkpoint_bf16_weight", "fp8_nn.Fp8Linear.from_checkpoint(torch.zeros(128, 128)"
                                    ".bfloat16(), torch.ones(128))", "error", ["weight_fp8"]),
    ("from_checkpoint_scale_shape", "fp8_nn.Fp8Linear.from_checkpoint(torch.zeros(128, 128)"
                                    ".to(E4), torch.ones(3))", "error", ["weight_scale"]),
    ("from_checkpoint_scale_int", "fp8_nn.Fp8Linear.from_checkpoint(torch.zeros(128, 128)"
                                  ".to(E4), torch.ones(128, dtype=torch.int32))", "error",
     ["weight_scale"]),
    ("from_checkpoint_scale_nan", "fp8_nn.Fp8Linear.from_checkpoint(torch.zeros(128, 128)"
                                  ".to(E4), torch.full((128,), float('nan')))", "error",
     ["nan"]),
    ("from_checkpoint_bias_shape", "fp8_nn.Fp8Linear.from_checkpoint(torch.zeros(128, 128)"
                                   ".to(E4), torch.ones(128), torch.zeros(64))", "error",
     ["bias"]),
    ("from_checkpoint_transposed_scale", "fp8_nn.Fp8Linear.from_checkpoint(torch.zeros(256, 128)"
                                         ".to(E4), torch.ones(1, 2))", "error",
     ["weight_scale"]),
    ("strict_cpu", "l = fp8_nn.Fp8Linear(128, 128, strict=True)\nl(x)", "error", ["cannot run"]),
    ("forward_wrong_features", "l = fp8_nn.Fp8Linear(128, 128)\nl(torch.randn(4, 64))",
     "error", ["64"]),
    ("patch_fp8_none", "fp8_nn.patch_fp8(None)", "error", ["Module"]),
    ("patch_fp8_bogus_scale", "fp8_nn.patch_fp8(torch.nn.Sequential(torch.nn.Linear(128, 128)), "
                              "scale='bogus')", "error", ["bogus"]),
    ("quantize_activation_bogus", "fp8_nn.quantize_activation(x, 'bogus')", "error", ["bogus"]),
    ("quantize_activation_block_k_100", "fp8_nn.quantize_activation(torch.randn(4, 100), 'block')",
     "error", ["100"]),
    ("quantize_activation_3d", "fp8_nn.quantize_activation(x.view(2, 2, 128), 'row')", "error",
     ["2-D"]),
    ("matmul_fp8_fp16_operands", "fp8_nn.matmul_fp8(x.half(), x.half(), torch.ones(()), "
                                 "torch.ones(()))", "error", ["float16"]),
]

FP8NN_WORKS = {
    "fallback_warns_and_matches": """
lin = torch.nn.Linear(128, 128).bfloat16()
l = fp8_nn.Fp8Linear.from_linear(lin, 'row')
y = l(x)
ok(l.fallbacks == 1, f'fallbacks {l.fallbacks}')
ok(close(y, F.linear(x.float(), lin.weight.float(), lin.bias.float()), 0.15), 'values')
""",
    "patch_fp8_keeps_fp32_odd": """
m = torch.nn.Sequential(torch.nn.Linear(12, 128))
rep = fp8_nn.patch_fp8(m)
ok(type(m[0]) is torch.nn.Linear, 'an odd layer was replaced')
""",
}

PARALLEL = [
    ("column_int", "from tirx_gemm.op import parallel as P\nP.ColumnParallelLinear(5)", "error",
     ["Linear"]),
    ("row_none", "from tirx_gemm.op import parallel as P\nP.RowParallelLinear(None, None)",
     "error", ["Linear"]),
    ("column_torch_linear", "from tirx_gemm.op import parallel as P\n"
                            "P.ColumnParallelLinear(torch.nn.Linear(64, 64))", "either",
     ["Linear"]),
    ("world_bad_group", "from tirx_gemm.op import parallel as P\nP.world(5)", "either",
     ["group"]),
    ("attention_heads_mismatch", "from tirx_gemm.op import parallel as P\n"
     "from tirx_gemm import nn as tnn\nl = lambda: P.ColumnParallelLinear(tnn.Linear(64, 64))\n"
     "P.ParallelAttentionProjections(l(), l(), l(), P.RowParallelLinear(tnn.Linear(64, 64), None), "
     "heads=3, kv_heads=2, head_dim=7)", "error", ["heads"]),
]


def cases():
    out = [py(f"grouped.{w}", "grouped GEMM", GROUPED_HEAD + c + "\n", e, n)
           for w, c, e, n in GROUPED]
    out += [py(f"grouped.works.{w}", "grouped GEMM", GROUPED_HEAD + c + "\n", "work")
            for w, c in GROUPED_WORKS.items()]
    out += [py(f"grouped_fp8.{w}", "fp8 grouped GEMM", GROUPED_FP8_HEAD + c + "\n", e, n)
            for w, c, e, n in GROUPED_FP8]
    out += [py(f"grouped_fp8.works.{w}", "fp8 grouped GEMM", GROUPED_FP8_HEAD + c + "\n", "work")
            for w, c in GROUPED_FP8_WORKS.items()]
    out += [py(f"moe.{w}", "MoE layer", MOE_HEAD + c + "\n", e, n, emulate=True)
            for w, c, e, n in MOE]
    out += [py(f"moe.works.{w}", "MoE layer", MOE_HEAD + c, "work") for w, c in MOE_WORKS.items()]
    out += [py(f"fp8_nn.{w}", "fp8 layers", FP8NN_HEAD + c + "\n", e, n, torch_ok=False)
            for w, c, e, n in FP8NN]
    out += [py(f"fp8_nn.works.{w}", "fp8 layers", FP8NN_HEAD + c, "work")
            for w, c in FP8NN_WORKS.items()]
    out += [py(f"parallel.{w}", "tensor-parallel layers", c + "\n", e, n) for w, c, e, n in PARALLEL]
    return out
