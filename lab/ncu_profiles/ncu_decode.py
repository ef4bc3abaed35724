"""One GEMM for Nsight Compute (decode shapes): tirx_gemm.matmul's pick or
torch.matmul at MxNxK, three warm-up calls and then the call ncu profiles (launch-skip 3).

    python lab/ncu_profiles/ncu_decode.py ours|torch M N K [dtype]
(TIRX_GEMM_BUNDLE names the bundle that holds matmul's kernel for the shape.)"""
import sys

import torch

mode, M, N, K = sys.argv[1], *map(int, sys.argv[2:5])
dtype = getattr(torch, sys.argv[5] if len(sys.argv) > 5 else "bfloat16")
a = torch.randn(M, K, device="cuda", dtype=dtype)
b = torch.randn(N, K, device="cuda", dtype=dtype)
if mode == "ours":
    import tirx_gemm
    fn = lambda: tirx_gemm.matmul(a, b)  # noqa: E731
else:
    fn = lambda: torch.matmul(a, b.T)  # noqa: E731
for _ in range(4):
    out = fn()
torch.cuda.synchronize()
ref = (a.float() @ b.float().T)
err = ((out.float() - ref).norm() / ref.norm()).item()
print(f"{mode} {M}x{N}x{K} {dtype}: rel err {err:.2e}")
sys.exit(0 if err < 1e-2 else 1)
