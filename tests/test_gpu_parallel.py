"""Tensor-parallel layers on GPUs (marked `gpu`): one process per GPU over NCCL, the shards on
tirx_gemm's kernels (strict: a shard falling back to torch fails the test), the block's output
within bf16's tolerance of the full module on torch. One GPU runs the one-rank case (the code
path of every rank); the two-rank case needs two GPUs and skips, saying so, with fewer.

The shards' shapes are lab/tensor_parallel_layers/shapes.py's block at 1 and 2 ranks; a bundle:
    python lab/tensor_parallel_layers/shapes.py 1,2 > tp.json
    tirx-gemm export --suite tp.json --arch sm_90a --num-sms 132 --out DIR
"""
import importlib.util
import os
import socket
import sys
from pathlib import Path

import pytest
import torch
import torch.multiprocessing as mp

pytestmark = pytest.mark.gpu
LAB = Path(__file__).resolve().parents[1] / "lab" / "tensor_parallel_layers"
CAP = torch.cuda.get_device_capability() if torch.cuda.is_available() else None


@pytest.fixture(autouse=True)
def _gpu():
    if CAP is None:
        pytest.skip("no CUDA GPU visible")
    if CAP != (9, 0):
        pytest.skip(f"needs sm_90a GPUs (compute capability 9.0); this one is {CAP[0]}.{CAP[1]}")
    if not os.environ.get("TIRX_GEMM_BUNDLE") and importlib.util.find_spec("tvm") is None:
        pytest.skip("no kernels: set TIRX_GEMM_BUNDLE to a bundle (see the module docstring)")


def _worker(rank, size, port, errors):
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    try:
        import torch.distributed as dist
        sys.path.insert(0, str(LAB))
        from bench import Block, ParallelBlock
        torch.cuda.set_device(rank)
        dist.init_process_group("nccl", rank=rank, world_size=size)
        torch.manual_seed(0)
        full = Block().to("cuda", torch.bfloat16)
        with torch.no_grad():
            block = ParallelBlock(full)
            for m in (1, 16, 512):
                x = torch.randn(1, m, full.mlp.gate_proj.in_features, device="cuda",
                                dtype=torch.bfloat16)
                got = block(x)
                h = x + _attn(full.attn, x)
                want = h + full.mlp.down_proj(torch.nn.functional.silu(full.mlp.gate_proj(h))
                                              * full.mlp.up_proj(h))
                err = ((got.float() - want.float()).norm() / want.float().norm()).item()
                assert err < 2e-2, f"{m} tokens: relative error {err:.2e}"
        dist.destroy_process_group()
    except Exception as exc:  # the parent fails the test with each rank's line
        errors.put(f"rank {rank}: {type(exc).__name__}: {str(exc).splitlines()[0]}")


def _attn(attn, x):
    from shapes import HEAD_DIM, HEADS, KV_HEADS
    b, s, _ = x.shape
    q = attn.q_proj(x).view(b, s, HEADS, HEAD_DIM).transpose(1, 2)
    k, v = (p(x).view(b, s, KV_HEADS, HEAD_DIM).transpose(1, 2) for p in (attn.k_proj, attn.v_proj))
    k, v = (t.repeat_interleave(HEADS // KV_HEADS, dim=1) for t in (k, v))
    y = torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)
    return attn.o_proj(y.transpose(1, 2).reshape(b, s, HEADS * HEAD_DIM))


def _run(size):
    if torch.cuda.device_count() < size:
        pytest.skip(f"needs {size} GPUs; {torch.cuda.device_count()} visible")
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    errors = mp.get_context("spawn").Queue()
    mp.start_processes(_worker, args=(size, port, errors), nprocs=size, start_method="spawn")
    found = [errors.get() for _ in range(errors.qsize())]
    if any("in bundle" in f or "no kernel" in f for f in found):
        pytest.skip(f"the bundle lacks a shard's kernel: {found[0]}")
    assert not found, "\n".join(found)


def test_one_rank_block_on_tirx_matches_the_full_module():
    _run(1)


def test_two_rank_block_on_tirx_matches_the_full_module():
    _run(2)
