"""Tensor-parallel layers on ``torch.distributed``: the op split over the GPUs of one node.

One process per GPU (``torchrun --nproc-per-node N``), each holding a shard of every weight;
the GEMMs run on tirx_gemm's kernels through :class:`tirx_gemm.nn.Linear` (so a shard the
kernels cannot serve falls back to torch exactly as that layer does), and the communication
is torch.distributed's own collectives (NCCL on GPUs, gloo on CPUs), issued on the current
stream. Nothing here is a home-made communication layer.

- :class:`ColumnParallelLinear`: rank r holds rows ``[r*n/W, (r+1)*n/W)`` of the weight
  (output features split); its output is the local slice of features, or the whole output
  with ``gather_output=True`` (an all-gather along the last dimension).
- :class:`RowParallelLinear`: rank r holds columns ``[r*k/W, (r+1)*k/W)`` of the weight
  (input features split); it takes the local slice of the input (``input_is_parallel``, what
  a column-parallel layer hands it) and sums the partial outputs with an all-reduce; the bias
  is added once, after the sum.
- :class:`ParallelMLP`: a Llama-style gated MLP, ``down(silu(gate(x)) * up(x))``, gate and up
  column-parallel, down row-parallel: one all-reduce per MLP.
- :class:`ParallelAttentionProjections`: q, k, v column-parallel by whole heads, the attention
  core on the local heads (``scaled_dot_product_attention``), o row-parallel: one all-reduce.

Every constructor takes the full layer (``from_linear``/``from_module``) and cuts this rank's
shard, so one seeded full model, built identically by every process, is the reference that a
test compares the tensor-parallel block with.
"""
from __future__ import annotations

import torch
import torch.distributed as dist
import torch.nn.functional as F

from tirx_gemm.op.nn import Linear

__all__ = ["ColumnParallelLinear", "RowParallelLinear", "ParallelMLP",
           "ParallelAttentionProjections", "world"]


def world(group=None) -> tuple[int, int]:
    """(rank, world size) of ``group`` (the default group when None); (0, 1) when
    torch.distributed is not initialised, so the layers also run in one process."""
    if not (dist.is_available() and dist.is_initialized()):
        return 0, 1
    return dist.get_rank(group), dist.get_world_size(group)


def _on_rank(group, who: str, layer, x):
    """``layer(x)``, with any error it raises naming this rank when the layer runs split over
    several (under torchrun every process prints its own traceback: the rank says which
    shard failed). An input on another device than the shard's weight is refused first:
    each process must work on its own GPU (``torch.cuda.set_device(local_rank)`` before it
    builds its layers)."""
    rank, size = world(group)
    w = layer.weight
    if isinstance(x, torch.Tensor) and x.device != w.device:
        raise ValueError(f"rank {rank} of {size}: {who} got its input on {x.device} but its shard "
                         f"is on {w.device}: move the input, or call torch.cuda.set_device("
                         "local_rank) before building the layers")
    if size == 1:
        return layer(x)
    try:
        return layer(x)
    except (ValueError, TypeError, RuntimeError) as exc:
        try:
            named = type(exc)(f"rank {rank} of {size}: {who}: {exc}")
        except Exception:  # an exception type that takes other arguments: keep it as is
            raise exc
        raise named from exc


def _check_local(local, who: str) -> None:
    """A one-line TypeError unless ``local`` is this rank's shard, a torch.nn.Linear (the
    layer failed at its first forward with "'int' object is not callable")."""
    if not isinstance(local, torch.nn.Linear):
        raise TypeError(f"{who} takes this rank's shard as a tirx_gemm.nn.Linear (or build it "
                        f"with {who}.from_linear(layer)), got {type(local).__name__}")


def _check_heads(layers, heads: int, kv_heads: int) -> int:
    """head_dim of q, k, v, o nn.Linears for ``heads`` query and ``kv_heads`` key/value
    heads, or a one-line ValueError: counts that do not divide the features failed at the
    first forward inside a view, or (kv_heads not dividing heads) in the attention."""
    for name, v in (("heads", heads), ("kv_heads", kv_heads)):
        if isinstance(v, bool) or not isinstance(v, int) or v < 1:
            raise ValueError(f"{name}={v!r} must be a positive int")
    q, k, v, o = layers
    if q.out_features % heads or heads % kv_heads:
        raise ValueError(f"heads={heads}, kv_heads={kv_heads} do not fit q_proj's "
                         f"{q.out_features} features: heads must divide them and kv_heads "
                         f"must divide heads")
    head_dim = q.out_features // heads
    for name, m, want in (("k_proj", k, kv_heads * head_dim), ("v_proj", v, kv_heads * head_dim)):
        if m.out_features != want:
            raise ValueError(f"{name} has {m.out_features} output features, not kv_heads * "
                             f"head_dim = {kv_heads} * {head_dim} = {want}: check heads and "
                             f"kv_heads")
    if o.in_features != q.out_features:
        raise ValueError(f"o_proj takes {o.in_features} features, q_proj gives "
                         f"{q.out_features}")
    return head_dim


def _check_local_heads(q, k, v, heads, kv_heads, head_dim) -> None:
    """This rank's q, k, v shards give heads * head_dim and kv_heads * head_dim features,
    or a one-line ValueError (the forward's view failed on them, or attended with a wrong
    head size where the products happened to match another split)."""
    for name, n in (("heads", heads), ("kv_heads", kv_heads), ("head_dim", head_dim)):
        if isinstance(n, bool) or not isinstance(n, int) or n < 1:
            raise ValueError(f"{name}={n!r} must be a positive int")
    if heads % kv_heads:
        raise ValueError(f"kv_heads={kv_heads} must divide heads={heads}")
    for name, m, want in (("q", q, heads * head_dim), ("k", k, kv_heads * head_dim),
                          ("v", v, kv_heads * head_dim)):
        got = getattr(getattr(m, "local", m), "out_features", None)
        if got != want:
            raise ValueError(f"{name} gives {got} features on this rank, not "
                             f"{'heads' if name == 'q' else 'kv_heads'} * head_dim = {want}")


def _split(n: int, parts: int, what: str) -> int:
    if n % parts:
        raise ValueError(f"{what}={n} does not split over {parts} ranks: it must be a multiple "
                         f"of the world size")
    return n // parts


def _shard_linear(layer: torch.nn.Linear, rows: slice | None, cols: slice | None,
                  bias: bool, strict: bool) -> Linear:
    w = layer.weight.detach()
    w = w[rows] if rows is not None else w
    w = w[:, cols] if cols is not None else w
    out = Linear(w.shape[1], w.shape[0], bias=bias and layer.bias is not None,
                 device=w.device, dtype=w.dtype, strict=strict)
    with torch.no_grad():
        out.weight.copy_(w)
        if out.bias is not None:
            b = layer.bias.detach()
            out.bias.copy_(b[rows] if rows is not None else b)
    return out


class ColumnParallelLinear(torch.nn.Module):
    """y = x @ W.T + b with W's rows (output features) split over the ranks."""

    def __init__(self, local: Linear, *, group=None, gather_output: bool = False):
        super().__init__()
        _check_local(local, "ColumnParallelLinear")
        self.local, self.group, self.gather_output = local, group, gather_output

    @classmethod
    def from_linear(cls, layer: torch.nn.Linear, *, group=None, gather_output: bool = False,
                    strict: bool = False) -> "ColumnParallelLinear":
        rank, size = world(group)
        n = _split(layer.out_features, size, "out_features")
        return cls(_shard_linear(layer, slice(rank * n, (rank + 1) * n), None, True, strict),
                   group=group, gather_output=gather_output)

    def forward(self, x):
        y = _on_rank(self.group, "ColumnParallelLinear", self.local, x)
        _, size = world(self.group)
        if not self.gather_output or size == 1:
            return y
        parts = [torch.empty_like(y) for _ in range(size)]
        dist.all_gather(parts, y.contiguous(), group=self.group)
        return torch.cat(parts, dim=-1)


class RowParallelLinear(torch.nn.Module):
    """y = x @ W.T + b with W's columns (input features) split over the ranks: each rank
    multiplies its slice of the input, an all-reduce sums the partial outputs, then the
    bias is added once."""

    def __init__(self, local: Linear, bias: torch.Tensor | None, *, group=None,
                 input_is_parallel: bool = True):
        super().__init__()
        _check_local(local, "RowParallelLinear")
        self.local, self.group, self.input_is_parallel = local, group, input_is_parallel
        self.bias = None if bias is None else torch.nn.Parameter(bias)

    @classmethod
    def from_linear(cls, layer: torch.nn.Linear, *, group=None, input_is_parallel: bool = True,
                    strict: bool = False) -> "RowParallelLinear":
        rank, size = world(group)
        k = _split(layer.in_features, size, "in_features")
        local = _shard_linear(layer, None, slice(rank * k, (rank + 1) * k), False, strict)
        bias = None if layer.bias is None else layer.bias.detach().clone()
        return cls(local, bias, group=group, input_is_parallel=input_is_parallel)

    def forward(self, x):
        rank, size = world(self.group)
        if not self.input_is_parallel and size > 1:
            k = self.local.in_features
            x = x[..., rank * k:(rank + 1) * k]
        y = _on_rank(self.group, "RowParallelLinear", self.local, x)
        if size > 1:
            dist.all_reduce(y, group=self.group)
        return y if self.bias is None else y + self.bias


class ParallelMLP(torch.nn.Module):
    """A Llama-style gated MLP split over the ranks: gate and up column-parallel (no
    gather), down row-parallel; one all-reduce per call."""

    def __init__(self, gate: ColumnParallelLinear, up: ColumnParallelLinear,
                 down: RowParallelLinear):
        super().__init__()
        self.gate, self.up, self.down = gate, up, down

    @classmethod
    def from_module(cls, mlp: torch.nn.Module, *, group=None, strict: bool = False,
                    names=("gate_proj", "up_proj", "down_proj")) -> "ParallelMLP":
        """From a module with three nn.Linear children (transformers' LlamaMLP / Qwen2MLP
        names by default) computing ``down(silu(gate(x)) * up(x))``."""
        g, u, d = (getattr(mlp, n, None) for n in names)
        missing = [n for n, m in zip(names, (g, u, d)) if not isinstance(m, torch.nn.Linear)]
        if missing:
            raise ValueError(f"{type(mlp).__name__} has no nn.Linear named {', '.join(missing)}")
        return cls(ColumnParallelLinear.from_linear(g, group=group, strict=strict),
                   ColumnParallelLinear.from_linear(u, group=group, strict=strict),
                   RowParallelLinear.from_linear(d, group=group, strict=strict))

    def forward(self, x):
        return self.down(F.silu(self.gate(x)) * self.up(x))


class ParallelAttentionProjections(torch.nn.Module):
    """q, k, v projections column-parallel by whole heads, causal attention on this rank's
    heads, o row-parallel (one all-reduce). Grouped-query attention: the key/value heads
    split over the ranks as the query heads do, so each rank keeps whole groups."""

    def __init__(self, q, k, v, o, heads: int, kv_heads: int, head_dim: int):
        super().__init__()
        _check_local_heads(q, k, v, heads, kv_heads, head_dim)
        self.q, self.k, self.v, self.o = q, k, v, o
        self.heads, self.kv_heads, self.head_dim = heads, kv_heads, head_dim

    @classmethod
    def from_module(cls, attn: torch.nn.Module, *, heads: int, kv_heads: int, group=None,
                    strict: bool = False,
                    names=("q_proj", "k_proj", "v_proj", "o_proj")) -> "ParallelAttentionProjections":
        layers = [getattr(attn, n, None) for n in names]
        missing = [n for n, m in zip(names, layers) if not isinstance(m, torch.nn.Linear)]
        if missing:
            raise ValueError(f"{type(attn).__name__} has no nn.Linear named {', '.join(missing)}")
        head_dim = _check_heads(layers, heads, kv_heads)
        _, size = world(group)
        local_heads = _split(heads, size, "heads")
        local_kv = _split(kv_heads, size, "kv_heads")
        q, k, v = (ColumnParallelLinear.from_linear(m, group=group, strict=strict)
                   for m in layers[:3])
        o = RowParallelLinear.from_linear(layers[3], group=group, strict=strict)
        return cls(q, k, v, o, local_heads, local_kv, head_dim)

    def forward(self, x):
        shape = x.shape[:-1]
        t = x.reshape(-1, x.shape[-2], x.shape[-1]) if x.dim() > 2 else x.unsqueeze(0)
        b, s = t.shape[0], t.shape[1]

        def heads(y, n):
            return y.view(b, s, n, self.head_dim).transpose(1, 2)

        q = heads(self.q(t), self.heads)
        k = heads(self.k(t), self.kv_heads)
        v = heads(self.v(t), self.kv_heads)
        if self.kv_heads != self.heads:
            rep = self.heads // self.kv_heads
            k, v = k.repeat_interleave(rep, dim=1), v.repeat_interleave(rep, dim=1)
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        y = y.transpose(1, 2).reshape(b, s, self.heads * self.head_dim)
        out = self.o(y)
        return out.reshape(*shape, out.shape[-1])
