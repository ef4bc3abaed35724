"""What the lab's GPU-host scripts share before they time anything: the card as their records
name it, the --out file, and a Linear's seeded operands (torch is handed in: the scripts import
it only after parsing their arguments).
"""
from __future__ import annotations


def card_name(props) -> str:
    """The card as records name it: its name and SM count, "NVIDIA H100 80GB HBM3 (132 SMs)"
    (``props``: torch.cuda.get_device_properties)."""
    return f"{props.name} ({props.multi_processor_count} SMs)"


def start(torch, out_path: str | None):
    """(device 0's properties, :func:`card_name`, ``out_path`` opened for appending or None);
    prints the card and torch's version."""
    props = torch.cuda.get_device_properties(0)
    card = card_name(props)
    print(card, "torch", torch.__version__, flush=True)
    return props, card, (open(out_path, "a") if out_path else None)


def linear_operands(torch, M: int, N: int, K: int, seed: int):
    """A Linear's bf16 operands on the GPU, drawn in this order from one generator seeded
    ``seed``: a (M x K), w (N x K, over sqrt(K)), bias (N, halved)."""
    bf = torch.bfloat16
    g = torch.Generator(device="cuda").manual_seed(seed)
    a = torch.randn(M, K, device="cuda", dtype=bf, generator=g)
    w = torch.randn(N, K, device="cuda", dtype=bf, generator=g) / K ** 0.5
    return a, w, torch.randn(N, device="cuda", dtype=bf, generator=g) * 0.5
