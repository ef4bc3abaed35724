"""The card matmul chooses for: its SMs, its L2 and its HBM bandwidth (pure Python; torch is
asked only for the GPU present). The cost model's figures were fitted on the H200; its one
explicit bandwidth term (cost_model.hbm_floor and the split model's HBM rate) scales by the
card's bandwidth over the H200's, so an H200 chooses as before and an H100 sees its slower HBM.

``card="auto"`` with a GPU (torch imported): the SM count and L2 size come from
``torch.cuda.get_device_properties`` and the bandwidth from :data:`CARDS` by the device's name
(torch does not report it); a name (an export, the CLI's ``--card``): from :data:`CARDS`.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass

MIB = 1 << 20


@dataclass(frozen=True)
class Card:
    """A GPU as the chooser sees it; ``source`` says where the figures came from."""
    name: str
    sms: int
    l2_bytes: int
    hbm_tb_s: float
    source: str = "table"
    # the K steps a unit of a two-way decode split holds at least, at up to
    # rules.SWAP_NP_MAX_M tokens (fewer: the non-persistent swap-AB kernel; lab/split_k_decode)
    decode_pair_min_k_steps: int = 8

    def line(self) -> str:
        return (f"{self.name}: {self.sms} SMs, {self.l2_bytes / MIB:g} MiB L2, "
                f"{self.hbm_tb_s:g} TB/s HBM ({self.source})")


# the project's cards (sm_90a, SXM), figures as the project's notes on them record: the
# H200's L2 reports as 60 MiB; the H100 80GB HBM3 has 132 SMs, about 3.35 TB/s against the
# H200's 4.8, and 50 MB of L2
CARDS = {
    "h200": Card("NVIDIA H200", 132, 60 * MIB, 4.8),
    "h100": Card("NVIDIA H100 80GB HBM3", 132, 50 * MIB, 3.35, decode_pair_min_k_steps=48),
}
FITTED_ON = "h200"  # the card the cost model's figures were fitted on (chooser_h200.json)


def _by_device_name(device_name: str) -> Card | None:  # the exact name: a PCIe or NVL differs
    return next((c for c in CARDS.values() if c.name == device_name), None)


def from_device(index: int | None = None) -> Card | None:
    """The current CUDA GPU (or GPU ``index``) as a Card, or None where torch is not imported
    (matmul imports it; the CLI does not: pass ``--card``) or sees no GPU. An unknown name
    takes the fitted card's bandwidth, and says so."""
    torch = sys.modules.get("torch")  # never imported here: `tirx-gemm choose` stays light
    if torch is None or not torch.cuda.is_available():
        return None
    props = torch.cuda.get_device_properties(torch.cuda.current_device() if index is None
                                             else index)
    known = _by_device_name(props.name)
    bandwidth = (known or CARDS[FITTED_ON]).hbm_tb_s
    source = ("device properties; bandwidth from the table" if known else
              f"device properties; bandwidth unknown, {CARDS[FITTED_ON].name}'s assumed")
    return Card(props.name, props.multi_processor_count, props.L2_cache_size, bandwidth, source,
                (known or CARDS[FITTED_ON]).decode_pair_min_k_steps)


def resolve(card: str | Card | None = None) -> Card:
    """The Card for ``card``: a Card as is, a name of :data:`CARDS` ("h100", "h200"), "auto"
    (the current GPU if an imported torch sees one, else the fitted card), or None: the
    fitted card (the H200). None stays the fitted card on every GPU, so that matmul asks
    for the kernels an exported bundle holds; the H100's scaled model is opt-in until an
    H100 run has checked its picks (lab/cost_model_fit)."""
    if isinstance(card, Card):
        return card
    if card is None:
        return CARDS[FITTED_ON]
    key = str(card).lower()
    if key == "auto":
        return from_device() or CARDS[FITTED_ON]
    if key not in CARDS:
        raise ValueError(f"card={card!r}: choose one of {', '.join(CARDS)}, auto")
    return CARDS[key]


def for_arch(card, arch: str, sm_count: int | None) -> tuple[Card, int]:
    """(:func:`resolve`'s card, the SMs): ``sm_count``, else the card's on the arches the
    cost model covers (sm_90a), else the arch's own (tirx_gemm.spec; 0 if unknown)."""
    from tirx_gemm import spec
    from tirx_gemm.op.keywords import MENU_ARCHES
    card = resolve(card)
    if sm_count is None:
        sm_count = card.sms if arch in MENU_ARCHES else spec.SM_COUNT.get(arch, 0)
    return card, sm_count


def bandwidth_scale(card: Card) -> float:
    """The card's HBM bandwidth over the fitted card's (1.0 on the H200 exactly)."""
    return card.hbm_tb_s / CARDS[FITTED_ON].hbm_tb_s
