"""The card matmul chooses for: its SMs, its L2 and its HBM bandwidth (pure Python; torch is
asked only for the GPU present). The cost model's figures were fitted on the H200; its one
explicit bandwidth term (cost_model.hbm_floor and the split model's HBM rate) scales by the
card's bandwidth over the H200's, so an H200 chooses as before and an H100 sees its slower HBM.

``card="auto"`` with a GPU (torch imported): the SM count and L2 size come from
``torch.cuda.get_device_properties`` and the bandwidth from :data:`CARDS` by the device's name
(torch does not report it); a name (an export, the CLI's ``--card``): from :data:`CARDS`.

Bundles and the card matmul assumes: ``tirx-gemm export --suite FILE --card h100,h200`` adds
each named card's picks and records the cards in the bundle (:data:`RECORD`, beside the
manifest). On a GPU host matmul chooses for the GPU present where every suite export into its
bundle was made for that card (:func:`assumed`), else for the fitted card (the H200), as
before; :func:`pick` is its choice, with one :class:`CardWarning` a process where the bundle
lacks the GPU's pick (it then runs the pick the bundle holds). ``tirx-gemm bench --suite --target
matmul`` plans under :func:`present`: for the GPU it times on, whatever the bundle's record.
"""

from __future__ import annotations

import contextlib
import contextvars
import json
import os
import sys
import warnings
from dataclasses import dataclass, replace
from pathlib import Path

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
    # the non-persistent swap-AB kernel's ring where the weight has DEEP_RING_TILES tiles of 64
    # rows (one CTA per SM, at most half the SMs pulling it); None: the rules' SWAP_NP_DEPTH
    # throughout (lab/decode_ring_depth)
    decode_np_deep_ring: int | None = None

    def line(self) -> str:
        return (f"{self.name}: {self.sms} SMs, {self.l2_bytes / MIB:g} MiB L2, "
                f"{self.hbm_tb_s:g} TB/s HBM ({self.source})")


# the project's cards (sm_90a, SXM), figures as the project's notes on them record: the
# H200's L2 reports as 60 MiB; the H100 80GB HBM3 has 132 SMs, about 3.35 TB/s against the
# H200's 4.8, and 50 MB of L2
CARDS = {
    "h200": Card("NVIDIA H200", 132, 60 * MIB, 4.8),
    "h100": Card("NVIDIA H100 80GB HBM3", 132, 50 * MIB, 3.35, decode_pair_min_k_steps=48,
                 decode_np_deep_ring=12),
}
# the tile counts the deeper ring was timed at and won (at 80 it ran slower; fewer than 36 were
# not timed: lab/decode_ring_depth)
DEEP_RING_TILES = range(36, 65)
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
    base = known or CARDS[FITTED_ON]
    return Card(props.name, props.multi_processor_count, props.L2_cache_size, bandwidth, source,
                base.decode_pair_min_k_steps, base.decode_np_deep_ring)


def resolve(card: str | Card | None = None) -> Card:
    """The Card for ``card``: a Card as is, a name of :data:`CARDS` ("h100", "h200"), "auto"
    (the current GPU if an imported torch sees one, else the fitted card), or None: the
    fitted card (the H200), or inside :func:`assuming` its card. None stays the fitted card
    on every GPU, so that matmul asks for the kernels an exported bundle holds; the H100's
    scaled model is opt-in (an export with ``--card h100``: :func:`assumed`) until an H100
    run has checked its picks (lab/cost_model_error_classes: the card A/B)."""
    if isinstance(card, Card):
        return card
    if card is None:
        return _ASSUMING.get() or CARDS[FITTED_ON]
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


# --------------------------------------------------------------------------------------
# exports for a card, and the card matmul assumes on a GPU host
# --------------------------------------------------------------------------------------
_ASSUMING: contextvars.ContextVar = contextvars.ContextVar("tirx_gemm_card", default=None)
RECORD = "cards.json"  # in a bundle: the cards each `tirx-gemm export --suite` picked for
RECORD_FORMAT = 1


@contextlib.contextmanager
def assuming(card):
    """Inside, ``card=None`` (every caller that names no card: suite plans, matmul.variants)
    means ``card``: what ``tirx-gemm export --card`` plans each card's picks under."""
    token = _ASSUMING.set(resolve(card))
    try:
        yield
    finally:
        _ASSUMING.reset(token)


_PRESENT: contextvars.ContextVar = contextvars.ContextVar("tirx_gemm_present", default=False)


@contextlib.contextmanager
def present(index: int | None = None):
    """Inside, every plan is for the GPU present (GPU ``index``), whatever a bundle was
    exported for: ``card=None`` means it (:func:`assuming`) and :func:`assumed` is it where it
    is a card of :data:`CARDS` (:func:`pick` then runs its pick where the bundle holds it,
    else the fitted card's with one CardWarning). What `tirx-gemm bench --suite --target
    matmul` plans under: the suite measures the picks of the card it runs on. Yields that
    card (the fitted card where no GPU is visible: nothing changes then)."""
    here = from_device(index)
    if here is None:
        yield CARDS[FITTED_ON]
        return
    token = _PRESENT.set(True)
    try:
        with assuming(here):
            yield here
    finally:
        _PRESENT.reset(token)


def card_keys(text: str) -> tuple[str, ...]:
    """``--card``'s value: card names of :data:`CARDS`, comma-separated, or "all" (every
    card), or "auto" (the GPU an imported torch sees); a ValueError naming the choices."""
    choices = f"{', '.join(CARDS)}, all or auto (several: h100,h200)"
    keys = []
    for word in str(text).lower().replace(" ", "").split(","):
        if word == "all":
            keys += list(CARDS)
        elif word == "auto":
            here = from_device()
            key = here and key_of(here)
            if key is None:
                why = ("no GPU is visible here" if here is None
                       else f"{here.name} is not a card of the table")
                raise ValueError(f"--card auto: {why}; name the GPU host's card: {choices}")
            keys.append(key)
        elif word in CARDS:
            keys.append(word)
        else:
            raise ValueError(f"--card {word!r} is not a card: choose {choices}")
    return tuple(dict.fromkeys(keys))


def key_of(card: Card) -> str | None:
    """The key of :data:`CARDS` whose card has ``card``'s device name, or None."""
    return next((k for k, c in CARDS.items() if c.name == card.name), None)


def read_record(bundle) -> dict | None:
    """The bundle's card record, or None where it has none (or an unreadable one)."""
    try:
        data = json.loads((Path(bundle) / RECORD).read_text(encoding="utf-8"))
    except (OSError, ValueError, RecursionError):
        return None
    exports = data.get("exports") if isinstance(data, dict) else None
    if not isinstance(exports, list) or not all(
            isinstance(e, dict) and isinstance(e.get("cards"), list) for e in exports):
        return None
    return data


def bundle_cards(bundle) -> tuple[str, ...]:
    """The cards whose picks every recorded suite export into ``bundle`` added (the record's
    intersection, in CARDS order); a bundle without a record: the fitted card (every export
    before ``--card`` planned for it)."""
    data = read_record(bundle)
    if data is None or not data["exports"]:
        return (FITTED_ON,)
    common = set(CARDS)
    for e in data["exports"]:
        common &= set(e["cards"])
    return tuple(k for k in CARDS if k in common)


def record_export(bundle, keys, what: dict, previous: dict | None, had_kernels: bool) -> dict:
    """Add one suite export for ``keys`` to ``bundle``'s record and write it (atomically).
    ``previous``: the record read before the export (an export rebuilds the bundle folder,
    so the file may be gone); ``had_kernels``: the bundle held kernels then, so a missing
    record means earlier exports for the fitted card."""
    bundle = Path(bundle)
    data = read_record(bundle) or previous
    if data is None:
        data = {"format": RECORD_FORMAT, "exports": []}
        if had_kernels:
            data["exports"].append({"cards": [FITTED_ON], "what": "exports before the record"})
    data["exports"].append({"cards": list(keys), **what})
    tmp = bundle / f".{RECORD}.tmp-{os.getpid()}"
    tmp.write_text(json.dumps(data, indent=1) + "\n", encoding="utf-8")
    os.replace(tmp, bundle / RECORD)
    return data


def assumed(bundle=None, index: int | None = None) -> Card:
    """The card matmul chooses for when not told one: the GPU present (:func:`from_device`,
    GPU ``index``) where it is a card of :data:`CARDS` and ``bundle`` (the one kernels come
    from) was exported for it (:func:`bundle_cards`); otherwise the fitted card, whose
    ``source`` then names the GPU present and the bundle's cards. Without a GPU or a bundle:
    the fitted card."""
    here = from_device(index)
    fitted = CARDS[FITTED_ON]
    if here is None or bundle is None:
        return fitted
    key, have = key_of(here), bundle_cards(bundle)
    if key is not None and key in have:
        return replace(here, source=f"{here.source}; the bundle was exported for it")
    if key is not None and _PRESENT.get():
        return replace(here, source=f"{here.source}; planned for the GPU present (the bundle "
                                    f"was exported for {', '.join(have) or 'no one card'})")
    if key == FITTED_ON:
        return fitted
    return replace(fitted, source=(f"table; assumed: the GPU is {here.name}, the bundle was "
                                   f"exported for {', '.join(have) or 'no one card'}"
                                   + (f" (`tirx-gemm export --card {key}` adds its picks)"
                                      if key else "")))


class CardWarning(UserWarning):
    """matmul runs another card's pick than the GPU present's (its bundle lacks it)."""


_warned = False
_libs: dict = {}


def _bundle_libs(bundle) -> frozenset:
    """The library names a bundle's manifest lists (cached by the manifest's mtime)."""
    from tirx_gemm import bundle_format
    path = Path(bundle) / bundle_format.MANIFEST
    try:
        stamp = os.stat(path).st_mtime_ns
    except OSError:
        return frozenset()
    hit = _libs.get(str(path))
    if hit is None or hit[0] != stamp:
        try:
            names = frozenset(e.get("lib") for e in bundle_format.read_manifest(Path(bundle))
                              ["kernels"] if isinstance(e, dict))
        except ValueError:
            names = frozenset()
        hit = _libs[str(path)] = (stamp, names)
    return hit[1]


def in_bundle(bundle, step_id: str, arch: str, mnk, kwargs: dict) -> bool:
    """Whether ``bundle``'s manifest lists the kernel (step, arch, kwargs) of a call at ``mnk``
    (built at keywords.build_shape; a normal build). Loading checks the bundle in full."""
    from tirx_gemm.bundle_format import lib_name
    from tirx_gemm.op.keywords import build_shape
    return lib_name(step_id, arch, *build_shape(tuple(mnk), kwargs), kwargs) in \
        _bundle_libs(bundle)


def _warn_once(text: str) -> None:
    global _warned
    if not _warned:
        _warned = True
        warnings.warn(text, CardWarning, stacklevel=2)


def pick(choose, M: int, N: int, K: int, dtype: str, arch: str, sm_count: int,
         epilogue: dict | None = None, *, bundle=None,
         index: int | None = None) -> tuple[str, dict]:
    """matmul's ``(step_id, kwargs)`` for a call on GPU ``index``: ``choose`` (rules.choose,
    passed in, as the rules import this module) on the :func:`assumed` card. Where that is the
    GPU's card but the bundle lacks its pick and holds the fitted card's: the fitted card's.
    Where the bundle was not exported for the GPU's card: the fitted card's pick, as before.
    Either way, where the GPU's pick is not what runs, one :class:`CardWarning` line a process
    names the card, the shape and the export to make."""
    card = assumed(bundle, index)
    step_id, kw = choose(M, N, K, dtype, arch, sm_count, epilogue, card=card)
    here = from_device(index) if bundle is not None else None
    key = here and key_of(here)
    if key is None or key == FITTED_ON:
        return step_id, kw
    fitted = CARDS[FITTED_ON]
    export = f"`tirx-gemm export --suite FILE --card {key},{FITTED_ON}` with FILE listing it"
    if card.name == here.name:
        if in_bundle(bundle, step_id, arch, (M, N, K), kw):
            return step_id, kw
        f_id, f_kw = choose(M, N, K, dtype, arch, sm_count, epilogue, card=fitted)
        if (f_id, f_kw) != (step_id, kw) and in_bundle(bundle, f_id, arch, (M, N, K), f_kw):
            _warn_once(f"tirx_gemm: bundle {bundle} lacks the {here.name}'s pick for "
                       f"{M}x{N}x{K} ({_kernel(step_id, arch, kw)}); matmul runs the "
                       f"{fitted.name}'s ({_kernel(f_id, arch, f_kw)}) where it lacks one; "
                       f"{export}")
            return f_id, f_kw
        return step_id, kw
    if _warned:  # the fitted card's pick runs either way: the other card's is not needed
        return step_id, kw
    h_id, h_kw = choose(M, N, K, dtype, arch, sm_count, epilogue, card=here)
    if (h_id, h_kw) != (step_id, kw):
        _warn_once(f"tirx_gemm: bundle {bundle} was exported for "
                   f"{', '.join(bundle_cards(bundle)) or 'no one card'}, not this {here.name}: "
                   f"matmul chooses as on the {fitted.name} ({M}x{N}x{K}: "
                   f"{_kernel(step_id, arch, kw)}; this card's pick: {_kernel(h_id, arch, h_kw)})"
                   f"; {export}")
    return step_id, kw


def _kernel(step_id: str, arch: str, kw: dict) -> str:
    """The kernel's name as profilers show it (what explain prints)."""
    from tirx_gemm import registry
    from tirx_gemm.compile.names import kernel_symbol
    return kernel_symbol(registry.get(step_id, arch), kw)
