"""Train one small GPT-style model twice, its Linear GEMMs on tirx_gemm and on torch, and compare
the loss curves.

The model (built here, random init from a fixed seed): token and position embeddings, LAYERS
pre-norm decoder blocks (causal attention by torch's scaled_dot_product_attention, a GELU
MLP), a final norm and an untied head; every Linear of the blocks and the head is a
:class:`Proj`, whose GEMMs run on tirx_gemm.op.autograd.linear (``tirx``) or on F.linear
(``torch``): the only difference between the two runs. Parameters are fp32 master weights,
cast to bf16 for each GEMM (the cast's backward brings the bf16 weight gradient back to
fp32); AdamW, a fixed learning rate after a short warm-up.

The corpus is synthetic and fixed: an order-2 Markov chain over VOCAB tokens whose transition
table comes from a seeded generator (every run, every host, the same tokens), so the loss
has something to learn and a floor (the chain's entropy rate, printed). The batches are drawn
from it in one fixed order.

Tolerance (stated before the runs): the two curves agree when every step's losses differ by at
most STEP_TOL nats and the means over the last TAIL steps by at most TAIL_TOL nats.

    python lab/training_backward/curve.py --out records/curve.jsonl [--plot curve.png]
    python lab/training_backward/curve.py --record-calls   # the kernels, for the bundle (CPU)
"""

from __future__ import annotations

import argparse
import datetime
import json
import math
import time
from pathlib import Path

import torch
import torch.nn as nn
import torch.nn.functional as F

VOCAB, SEQ, BATCH = 64, 128, 16          # 2048 tokens a step
DIM, HEADS, LAYERS, MLP = 256, 4, 4, 1024
STEPS, LR, WARMUP = 300, 3e-3, 20
SEED = 1234
STEP_TOL, TAIL, TAIL_TOL = 0.05, 50, 0.02


class Proj(nn.Module):
    """A Linear (fp32 master weight, bf16 GEMM) whose GEMMs run on ``backend``."""

    def __init__(self, n_in, n_out, backend, bias=True):
        super().__init__()
        self.weight = nn.Parameter(torch.randn(n_out, n_in) / math.sqrt(n_in))
        self.bias = nn.Parameter(torch.zeros(n_out)) if bias else None
        self.backend = backend

    def forward(self, x):
        w = self.weight.to(torch.bfloat16)
        b = None if self.bias is None else self.bias.to(torch.bfloat16)
        x = x.to(torch.bfloat16)
        if self.backend == "tirx":
            from tirx_gemm.op import autograd as AG
            return AG.linear(x, w, b)
        return F.linear(x, w, b)


class Block(nn.Module):
    def __init__(self, backend):
        super().__init__()
        self.n1, self.n2 = nn.LayerNorm(DIM), nn.LayerNorm(DIM)
        self.qkv, self.o = Proj(DIM, 3 * DIM, backend), Proj(DIM, DIM, backend)
        self.up, self.down = Proj(DIM, MLP, backend), Proj(MLP, DIM, backend)

    def forward(self, x):
        B, T, _ = x.shape
        q, k, v = self.qkv(self.n1(x)).view(B, T, 3, HEADS, DIM // HEADS).unbind(2)
        att = F.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2),
                                             v.transpose(1, 2), is_causal=True)
        x = x + self.o(att.transpose(1, 2).reshape(B, T, DIM)).float()
        return x + self.down(F.gelu(self.up(self.n2(x)))).float()


class GPT(nn.Module):
    def __init__(self, backend):
        super().__init__()
        self.tok, self.pos = nn.Embedding(VOCAB, DIM), nn.Embedding(SEQ, DIM)
        self.blocks = nn.ModuleList(Block(backend) for _ in range(LAYERS))
        self.norm = nn.LayerNorm(DIM)
        self.head = Proj(DIM, VOCAB, backend, bias=False)

    def forward(self, idx):
        x = self.tok(idx) + self.pos(torch.arange(idx.shape[1], device=idx.device))
        for blk in self.blocks:
            x = blk(x)
        return self.head(self.norm(x)).float()


def corpus(n_tokens: int):
    """The fixed synthetic corpus (CPU, int64) and its entropy rate in nats per token."""
    g = torch.Generator().manual_seed(SEED)
    logits = torch.randn(VOCAB, VOCAB, VOCAB, generator=g) * 2.5
    probs = logits.softmax(-1)
    seq = torch.empty(n_tokens, dtype=torch.long)
    seq[:2] = torch.randint(VOCAB, (2,), generator=g)
    u = torch.rand(n_tokens, generator=g)
    cdf = probs.cumsum(-1)
    for i in range(2, n_tokens):
        seq[i] = min(int(torch.searchsorted(cdf[seq[i - 2], seq[i - 1]], u[i])), VOCAB - 1)
    ent = -(probs * probs.clamp_min(1e-30).log()).sum(-1)
    counts = torch.zeros(VOCAB, VOCAB)
    counts.index_put_((seq[:-2], seq[1:-1]), torch.ones(n_tokens - 2), accumulate=True)
    rate = float((counts / counts.sum() * ent).sum())
    return seq, rate


def batches(seq, steps):
    g = torch.Generator().manual_seed(SEED + 1)
    starts = torch.randint(len(seq) - SEQ - 1, (steps, BATCH), generator=g)
    for s in starts:
        idx = torch.stack([seq[i:i + SEQ + 1] for i in s.tolist()])
        yield idx[:, :-1], idx[:, 1:]


def train(backend: str, device: str, steps: int, seq):
    torch.manual_seed(SEED)
    model = GPT(backend).to(device)
    opt = torch.optim.AdamW(model.parameters(), lr=LR, weight_decay=0.0)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: min(1.0, (s + 1) / WARMUP))
    losses, t0 = [], time.perf_counter()
    for x, y in batches(seq, steps):
        x, y = x.to(device), y.to(device)
        loss = F.cross_entropy(model(x).view(-1, VOCAB), y.reshape(-1))
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        sched.step()
        losses.append(loss.detach())
    losses = [float(v) for v in torch.stack(losses).cpu()]
    return losses, time.perf_counter() - t0


def compare(a, b) -> dict:
    step = max(abs(x - y) for x, y in zip(a, b))
    tail = abs(sum(a[-TAIL:]) / TAIL - sum(b[-TAIL:]) / TAIL)
    return {"max_step_diff": round(step, 4), "tail_mean_diff": round(tail, 4),
            "step_tol": STEP_TOL, "tail": TAIL, "tail_tol": TAIL_TOL,
            "agree": step <= STEP_TOL and tail <= TAIL_TOL}


def record_calls():
    """The GEMM calls of one training step (CPU replay, calls.py): what the bundle needs."""
    import sys
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    import calls as C
    seq, _ = corpus(4 * SEQ * BATCH)
    with C.recording() as rec:
        torch.manual_seed(SEED)
        model = GPT("tirx")
        x, y = next(batches(seq, 1))
        F.cross_entropy(model(x).view(-1, VOCAB), y.reshape(-1)).backward()
    return rec


def plot(recs, path: Path):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, ax = plt.subplots(figsize=(7, 4))
    for r in recs:
        ax.plot(range(1, len(r["losses"]) + 1), r["losses"], label=r["backend"], lw=1)
    ax.axhline(recs[0]["entropy_rate"], color="gray", ls=":", lw=1, label="corpus entropy rate")
    ax.set_xlabel("step")
    ax.set_ylabel("cross-entropy (nats/token)")
    ax.set_title(f"GPT {LAYERS}x{DIM}, {SEQ * BATCH} tokens/step, {recs[0]['card']}")
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path)
    ap.add_argument("--plot", type=Path)
    ap.add_argument("--steps", type=int, default=STEPS)
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--record-calls", action="store_true")
    ap.add_argument("--plot-from", type=Path, help="plot the last two records of this file")
    args = ap.parse_args(argv)
    if args.plot_from:
        recs = [json.loads(line) for line in args.plot_from.read_text().splitlines()][-2:]
        plot(recs, args.plot or args.plot_from.with_suffix(".png"))
        return 0
    if args.record_calls:
        for c in record_calls():
            print(c)
        return 0
    seq, rate = corpus(60_000)
    card = torch.cuda.get_device_name(0) if args.device == "cuda" else "CPU"
    recs = []
    for backend in ("tirx", "torch"):
        losses, secs = train(backend, args.device, args.steps, seq)
        recs.append({"date": datetime.date.today().isoformat(), "card": card,
                     "backend": backend, "steps": args.steps, "tokens_per_step": SEQ * BATCH,
                     "model": f"{LAYERS}x{DIM} heads {HEADS} mlp {MLP} vocab {VOCAB}",
                     "entropy_rate": round(rate, 4), "seconds": round(secs, 2),
                     "losses": [round(v, 5) for v in losses]})
        print(f"{backend}: first {losses[0]:.4f} last {losses[-1]:.4f} in {secs:.1f} s",
              flush=True)
    verdict = compare(recs[0]["losses"], recs[1]["losses"])
    print(json.dumps(verdict))
    if args.out:
        with args.out.open("a") as f:
            for r in recs:
                f.write(json.dumps({**r, **verdict}) + "\n")
    if args.plot:
        try:
            plot(recs, args.plot)
        except ImportError as exc:  # a GPU host without matplotlib: plot the records here
            print(f"no plot ({exc}): python lab/training_backward/curve.py --plot-from RECORDS")
    return 0 if verdict["agree"] else 1


if __name__ == "__main__":
    raise SystemExit(main())
