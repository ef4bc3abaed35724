"""The tensor-parallel block on tirx_gemm against the same layers on torch, one process per GPU.

    torchrun --nproc-per-node N lab/tensor_parallel_layers/bench.py --out records/tp_N.jsonl

Each rank builds the same seeded full block (shapes.py), keeps its shard, and times under CUDA
graphs, in one run: the block with its shards on tirx_gemm's kernels, the same shards on
F.linear (torch.matmul's cuBLAS), and the block's all-reduces alone (the communication share).
Rank 0 writes one record per token count: milliseconds of each, their ratio, the card, N.
"""
import argparse
import json
import os
import sys
import time
import types
import warnings

import torch
import torch.distributed as dist

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from shapes import FFN, HEADS, HIDDEN, KV_HEADS, TOKENS  # noqa: E402

from tirx_gemm.op import parallel as P  # noqa: E402
from tirx_gemm.op.nn import Linear  # noqa: E402


class Block(torch.nn.Module):
    def __init__(self):
        super().__init__()
        lin = torch.nn.Linear
        self.attn = torch.nn.Module()
        for name, n in (("q_proj", HIDDEN), ("k_proj", HIDDEN * KV_HEADS // HEADS),
                        ("v_proj", HIDDEN * KV_HEADS // HEADS), ("o_proj", HIDDEN)):
            setattr(self.attn, name, lin(HIDDEN, n, bias=False))
        self.mlp = torch.nn.Module()
        self.mlp.gate_proj = lin(HIDDEN, FFN, bias=False)
        self.mlp.up_proj = lin(HIDDEN, FFN, bias=False)
        self.mlp.down_proj = lin(FFN, HIDDEN, bias=False)


class ParallelBlock(torch.nn.Module):
    def __init__(self, full):
        super().__init__()
        self.attn = P.ParallelAttentionProjections.from_module(full.attn, heads=HEADS,
                                                               kv_heads=KV_HEADS, strict=True)
        self.mlp = P.ParallelMLP.from_module(full.mlp, strict=True)

    def forward(self, x):
        h = x + self.attn(x)
        return h + self.mlp(h)


def on_torch(block):
    """The same shards on F.linear (cuBLAS): each tirx Linear's forward replaced."""
    for m in block.modules():
        if isinstance(m, Linear):
            m.forward = types.MethodType(torch.nn.Linear.forward, m)
    return block


def graph_ms(fn, reps=20):
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        for _ in range(3):
            fn()
    torch.cuda.current_stream().wait_stream(s)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        fn()
    g.replay()
    torch.cuda.synchronize()
    t0, t1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    t0.record()
    for _ in range(reps):
        g.replay()
    t1.record()
    t1.synchronize()
    return t0.elapsed_time(t1) / reps


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--tokens", default=",".join(map(str, TOKENS)))
    ap.add_argument("--out", required=True)
    args = ap.parse_args()
    rank, world = int(os.environ.get("RANK", 0)), int(os.environ.get("WORLD_SIZE", 1))
    torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", 0)))
    dist.init_process_group("nccl")
    warnings.simplefilter("error")  # a shard falling back to torch would not be measured
    torch.manual_seed(0)
    full = Block().to("cuda", torch.bfloat16)
    tirx, torch_block = ParallelBlock(full), on_torch(ParallelBlock(full))
    del full
    card = torch.cuda.get_device_name()
    recs = []
    with torch.no_grad():
        for m in (int(t) for t in args.tokens.split(",")):
            x = torch.randn(1, m, HIDDEN, device="cuda", dtype=torch.bfloat16)
            err = (tirx(x) - torch_block(x)).abs().max().item()
            y = torch.empty(m, HIDDEN, device="cuda", dtype=torch.bfloat16)
            comm = graph_ms(lambda: (dist.all_reduce(y), dist.all_reduce(y))) if world > 1 else 0.0
            t_tirx, t_torch = graph_ms(lambda: tirx(x)), graph_ms(lambda: torch_block(x))
            rec = {"card": card, "world": world, "tokens": m, "tirx_ms": round(t_tirx, 4),
                   "torch_ms": round(t_torch, 4), "speedup": round(t_torch / t_tirx, 4),
                   "comm_ms": round(comm, 4), "comm_share": round(comm / t_tirx, 4),
                   "max_abs_diff": err, "time": time.strftime("%Y-%m-%dT%H:%M:%S")}
            recs.append(rec)
            if rank == 0:
                print(json.dumps(rec), flush=True)
    if rank == 0:
        with open(args.out, "a") as f:
            for r in recs:
                f.write(json.dumps(r) + "\n")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
