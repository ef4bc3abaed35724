"""Tensor-parallel layers (tirx_gemm.op.parallel): the sharding and the collectives, checked
against the full module in two CPU processes over gloo (the layers' shards fall back to
F.linear on a CPU, so what these tests prove is the split and the communication; the GPU
tests in test_gpu_parallel.py run the shards on tirx_gemm's kernels)."""
import os
import re
import socket
import warnings

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from tirx_gemm import nn as tnn
from tirx_gemm.op import parallel as P


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class _MLP(torch.nn.Module):  # transformers' LlamaMLP names
    def __init__(self, h, f):
        super().__init__()
        self.gate_proj = torch.nn.Linear(h, f, bias=False)
        self.up_proj = torch.nn.Linear(h, f, bias=False)
        self.down_proj = torch.nn.Linear(f, h, bias=True)

    def forward(self, x):
        return self.down_proj(torch.nn.functional.silu(self.gate_proj(x)) * self.up_proj(x))


class _Attn(torch.nn.Module):
    def __init__(self, h, heads, kv_heads):
        super().__init__()
        d = h // heads
        self.q_proj = torch.nn.Linear(h, heads * d)
        self.k_proj = torch.nn.Linear(h, kv_heads * d)
        self.v_proj = torch.nn.Linear(h, kv_heads * d)
        self.o_proj = torch.nn.Linear(heads * d, h, bias=False)


def _reference_attn(attn, x, heads, kv_heads):
    b, s, h = x.shape
    d = h // heads
    q = attn.q_proj(x).view(b, s, heads, d).transpose(1, 2)
    k = attn.k_proj(x).view(b, s, kv_heads, d).transpose(1, 2)
    v = attn.v_proj(x).view(b, s, kv_heads, d).transpose(1, 2)
    k, v = (t.repeat_interleave(heads // kv_heads, dim=1) for t in (k, v))
    y = torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)
    return attn.o_proj(y.transpose(1, 2).reshape(b, s, h))


def _worker(rank, size, port, errors):
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    try:
        dist.init_process_group("gloo", rank=rank, world_size=size)
        warnings.simplefilter("ignore")  # the shards' CPU fallback warns once per reason
        torch.manual_seed(0)  # every rank builds the same full modules
        mlp, attn = _MLP(32, 64), _Attn(32, 4, 2)
        x = torch.randn(3, 5, 32)
        with torch.no_grad():
            tp = P.ParallelMLP.from_module(mlp)
            assert tp.gate.local.out_features == 64 // size
            torch.testing.assert_close(tp(x), mlp(x), rtol=1e-5, atol=1e-5)
            col = P.ColumnParallelLinear.from_linear(mlp.gate_proj, gather_output=True)
            torch.testing.assert_close(col(x), mlp.gate_proj(x), rtol=1e-5, atol=1e-5)
            row = P.RowParallelLinear.from_linear(mlp.down_proj, input_is_parallel=False)
            h = torch.randn(7, 64)
            torch.testing.assert_close(row(h), mlp.down_proj(h), rtol=1e-5, atol=1e-5)
            ta = P.ParallelAttentionProjections.from_module(attn, heads=4, kv_heads=2)
            torch.testing.assert_close(ta(x), _reference_attn(attn, x, 4, 2),
                                       rtol=1e-5, atol=1e-5)
        dist.destroy_process_group()
    except Exception as exc:  # reported to the parent, which fails the test with it
        errors.put(f"rank {rank}: {type(exc).__name__}: {exc}")


@pytest.mark.parametrize("size", [1, 2])
def test_tensor_parallel_blocks_match_the_full_module_over_gloo(size):
    ctx = mp.get_context("spawn")
    errors = ctx.Queue()
    mp.start_processes(_worker, args=(size, _free_port(), errors), nprocs=size,
                       start_method="spawn", join=True)
    found = [errors.get() for _ in range(errors.qsize())] if not errors.empty() else []
    assert not found, "\n".join(found)


def test_a_split_that_does_not_divide_is_refused_in_one_line(monkeypatch):
    monkeypatch.setattr(P, "world", lambda group=None: (0, 3))
    with pytest.raises(ValueError, match=r"out_features=64 does not split over 3 ranks"):
        P.ColumnParallelLinear.from_linear(torch.nn.Linear(32, 64))
    with pytest.raises(ValueError, match=r"heads=4 does not split over 3 ranks"):
        P.ParallelAttentionProjections.from_module(_Attn(32, 4, 2), heads=4, kv_heads=2)


def test_a_module_without_the_named_layers_is_refused():
    with pytest.raises(ValueError, match="has no nn.Linear named gate_proj"):
        P.ParallelMLP.from_module(torch.nn.Sequential(torch.nn.Linear(4, 4)))


def test_without_torch_distributed_the_layers_are_the_whole_layer():
    assert P.world() == (0, 1)
    torch.manual_seed(1)
    mlp = _MLP(16, 32)
    with warnings.catch_warnings(), torch.no_grad():
        warnings.simplefilter("ignore")
        x = torch.randn(4, 16)
        torch.testing.assert_close(P.ParallelMLP.from_module(mlp)(x), mlp(x))


def test_a_shard_that_is_no_linear_or_heads_that_do_not_fit_are_refused_in_one_line():
    """ColumnParallelLinear(5) was taken and failed at its first forward ("'int' object is
    not callable"); heads that do not divide q_proj's features, or k/v projections of
    another width, failed inside a view at the first forward."""
    for make in (lambda: P.ColumnParallelLinear(5), lambda: P.RowParallelLinear(None, None)):
        with pytest.raises(TypeError, match="takes this rank's shard as a tirx_gemm.nn.Linear"):
            make()
    attn = _Attn(16, 4, 2)  # q 16 features = 4 heads of 4, k/v 2 heads of 4
    for heads, kv_heads, needle in ((3, 1, "heads=3, kv_heads=1 do not fit q_proj's 16"),
                                    (4, 3, "kv_heads must divide heads"),
                                    (8, 2, "k_proj has 8 output features, not kv_heads"),
                                    (0, 1, "heads=0 must be a positive int")):
        with pytest.raises(ValueError, match=re.escape(needle)):
            P.ParallelAttentionProjections.from_module(attn, heads=heads, kv_heads=kv_heads)
    P.ParallelAttentionProjections.from_module(attn, heads=4, kv_heads=2)  # the right counts
    col = lambda n: P.ColumnParallelLinear(tnn.Linear(16, n))  # noqa: E731
    row = P.RowParallelLinear(tnn.Linear(16, 16), None)
    with pytest.raises(ValueError, match=r"q gives 16 features on this rank, not heads \* "
                                         r"head_dim = 21"):
        P.ParallelAttentionProjections(col(16), col(8), col(8), row, heads=3, kv_heads=1,
                                       head_dim=7)


def test_a_failing_shard_names_its_rank(monkeypatch):
    monkeypatch.setattr(P, "world", lambda group=None: (1, 2))
    col = P.ColumnParallelLinear.from_linear(torch.nn.Linear(32, 64))
    with pytest.raises((ValueError, RuntimeError), match=r"^rank 1 of 2: ColumnParallelLinear: "):
        col(torch.randn(3, 16))  # 16 input features where the shard takes 32
    row = P.RowParallelLinear.from_linear(torch.nn.Linear(64, 32))
    with pytest.raises((ValueError, RuntimeError), match=r"^rank 1 of 2: RowParallelLinear: "):
        row(torch.randn(3, 8))


def test_an_input_on_another_device_than_the_shard_is_refused(monkeypatch):
    monkeypatch.setattr(P, "world", lambda group=None: (0, 2))
    col = P.ColumnParallelLinear.from_linear(torch.nn.Linear(32, 64))
    with pytest.raises(ValueError, match=r"rank 0 of 2: ColumnParallelLinear got its input on meta "
                                         r"but its shard is on cpu.*set_device"):
        col(torch.empty(3, 32, device="meta"))
