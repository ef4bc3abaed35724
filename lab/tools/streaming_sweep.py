"""Sets of v12 kernels at sets of shapes on the H200 under the interleaved graph timing.
Per shape it times torch.mm and the set's kernels as CUDA graphs replayed alternately after
a warm-up, each kernel checked first; with ``--pairwise`` each kernel is alternated with
torch.mm alone (matmul_graph_times' protocol): the GPU's clock settles to the power the pair
draws, not the whole set's, and kernels whose speed follows the SM clock read differently.

    python lab/tools/streaming_sweep.py export --out .gpu/stream [--set S]          # here
    python lab/tools/streaming_sweep.py run --bundle .gpu/stream --out FILE.jsonl [--set S]
    python lab/tools/streaming_sweep.py clocks --records FILE.jsonl --smi CLOCKS.csv --out F

Sets (``--set``):
  streaming  weight-streaming shapes (M <= 128 tokens, a wide weight): matmul's 64-row picks
             there slow down more than torch's kernels once the GPU is settled (README,
             "order bias"); other tiles, two consumer warpgroups, more wgmma groups in
             flight (64x96L2, 64x128L2: MMA_LAG=2, which left the builder: `git apply
             lab/mma_lag_and_l2_hints/patches/mma_lag.patch` first, else export stops with a
             one-line error naming it; lab/tools/lab_patches.py), pairs, swap-AB.
  pairs      a few hundred tokens on a wide weight with a deep K, and mid-size squares: the
             one-CTA tile against the CTA pair that shares its B tile by multicast
             (CLUSTER=2), which moves fewer bytes from L2 to the SMs per flop (cuBLAS runs
             pairs at these shapes: lab/cublas_kernels/records/cublas_kernels*_h200.jsonl).
  swaptma    swap-AB tiles with D stored element by element against SWAP_TMA (stmatrix
             .trans, TMA stores), decode shapes and many tokens on a narrow weight.
  shortk     a thousand tokens or more on a K of 640-2560 (ViT, BERT, Whisper, GPT-2,
             diffusion U-Net layers): v10's ping-pong and v9 (built per N and K) beside
             v12's 128-row tiles and swap-AB tiles stored by TMA, to see where the epilogue
             v10 hides under the other warpgroup's mainloop pays.
  midk       shortk's kernels at a K of 1536-2560 (Qwen2, GPT-2 XL, Llama-3.2-1B, Phi-2
             layers, 2304^3): how far up in K v10's ping-pong keeps its lead.
  tailtma    plain tiles whose width is not a multiple of 64, their last columns stored
             element by element or (TAIL_TMA) by one more TMA store, at shapes matmul
             gives such tiles.
  tailshare  the tiles whose tail staging tile lies over the last chunk's (TAIL_TMA where a
             tile of its own would cost the ring a stage), against element stores.
  midm       a few hundred tokens on a deep K: plain tiles against swap-AB tiles stored by
             TMA (cuBLAS runs swapped tiles there).
  swpair     midm's shapes: swap-AB CTA pairs stored by TMA (the token tile shared by
             multicast) against midm's fastest one-CTA tiles.
  m129       128-160 tokens on a 4096x4096 and an 8192x3584 weight: the kernels matmul
             picks there, with and without PDL (129 tokens ran slower than 160), and each
             with SHIFT_LAST (checked bit for bit against its twin without).
  oob        where SHIFT_LAST pays: last token tiles 1-56 rows short of full, or full, on
             three weights; one-CTA tiles with and without it (bit for bit twins).
  oobpick    matmul's 64-row picks at real-model shapes with a short last token tile, with
             and without SHIFT_LAST, both dtypes.
  tok8       decode: swap-AB token tiles sized to the tokens (a multiple of 8, as cuBLAS's)
             against the next size up of chooser.SWAP_AB_TILES, matmul's keywords;
             tok8b the sizes between (56, 88).
  nk         matmul's 64x160, 64x224 and 64x96 kernels (RUNTIME_NK, TAIL_TMA, PREFETCH_MAPS,
             SHIFT_LAST) beside the same tiles without each option and built for the
             shape's N and K (run with --pairwise).

One JSON line per (shape, dtype): torch's time and each kernel's time and ratio.
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from v12_sweep import _check, _graphs_interleaved, _inputs  # noqa: E402
import lab_patches  # noqa: E402

from tirx_gemm.op import rules as chooser  # noqa: E402  (pure Python: matmul's tail rule)


def with_shift_twins(kernels: dict) -> dict:
    """``kernels`` and, for each, its twin with SHIFT_LAST ("<name>s"; run() compares the
    twin's D with the original's bit for bit)."""
    return {**kernels, **{f"{k}s": {**kw, "SHIFT_LAST": True} for k, kw in kernels.items()}}


SHAPES = ((128, 6144, 4096), (64, 6144, 4096), (128, 8192, 28672), (128, 4096, 4096),
          (128, 14336, 4096), (128, 4096, 14336), (128, 10240, 8192))
BASE = {"SM_COUNT": 132, "RUNTIME_M": True, "RUNTIME_NK": True}
PF = {"PREFETCH_MAPS": True}
# label -> v12 keywords (beside BASE and the dtype)
KERNELS = {
    "64x64": {"BLK_M": 64, "BLK_N": 64, **PF},
    "64x64p": {"BLK_M": 64, "BLK_N": 64, "PDL": True, **PF},
    "64x96": {"BLK_M": 64, "BLK_N": 96, **PF},
    "64x128": {"BLK_M": 64, "BLK_N": 128, **PF},
    "64x160": {"BLK_M": 64, "BLK_N": 160, **PF},
    "64x224": {"BLK_M": 64, "BLK_N": 224, **PF},
    "64x96L2": {"BLK_M": 64, "BLK_N": 96, "MMA_LAG": 2, **PF},
    "64x128L2": {"BLK_M": 64, "BLK_N": 128, "MMA_LAG": 2, **PF},
    "128x48": {"BLK_M": 128, "BLK_N": 48, **PF},
    "128x64": {"BLK_M": 128, "BLK_N": 64, **PF},
    "128x96": {"BLK_M": 128, "BLK_N": 96, **PF},
    "64x96c2": {"BLK_M": 64, "BLK_N": 96, "CLUSTER": 2},
    "64x128c2": {"BLK_M": 64, "BLK_N": 128, "CLUSTER": 2},
    "64x64w": {"BLK_M": 64, "BLK_N": 64, "SWAP_AB": True, **PF},
    "64x128w": {"BLK_M": 64, "BLK_N": 128, "SWAP_AB": True, **PF},
}


# the pairs set: shapes (M spans at least two 64-row tiles) and one-CTA tiles with their pairs
PAIR_SHAPES = ((256, 5120, 13824), (256, 4096, 14336), (512, 4096, 14336),
               (256, 14336, 4096), (256, 28672, 8192), (192, 6144, 4096), (333, 4096, 14336),
               (128, 6144, 4096), (2304, 2304, 2304), (1500, 3840, 1280),
               (2049, 3584, 3584), (3152, 768, 3072), (3152, 2304, 768))
PAIR_TILES = ((64, 96), (64, 128), (64, 160), (64, 208), (64, 256), (128, 80), (128, 128),
              (128, 168), (128, 176), (128, 192), (128, 240))
# a pair's BLK_N is a multiple of 16 (each CTA loads half of B): 128x168 runs alone
PAIR_KERNELS = {f"{bm}x{bn}{c}": {"BLK_M": bm, "BLK_N": bn, **({"CLUSTER": 2} if c else PF)}
                for bm, bn in PAIR_TILES for c in ("", "c2") if not c or bn % 16 == 0}
# the swaptma set: swap-AB tiles stored element by element against SWAP_TMA (stmatrix .trans
# and TMA stores), at decode shapes and at many tokens on a narrow weight (where swapping the
# sides fills a wave better: 3152x768 in 128x144 swapped tiles is 6 x 22 = 132 tiles), beside
# the one-CTA tiles matmul takes there. Token tiles with and without a tail of 64.
SWAP_SHAPES = ((1, 4096, 4096), (8, 14336, 4096), (37, 14336, 4096), (77, 7168, 2048),
               (64, 8192, 8192), (100, 1000, 1024), (1000, 1000, 1000),
               (3152, 768, 3072), (4096, 768, 3072), (1500, 768, 3072), (6000, 768, 768),
               (3000, 512, 3072), (2304, 2304, 2304))
SWAP_TILES = ((64, 16), (64, 48), (64, 80), (128, 96), (128, 128), (128, 144), (128, 192),
              (128, 176))
SWAP_KERNELS = {f"{bm}x{bn}w{t}": {"BLK_M": bm, "BLK_N": bn, "SWAP_AB": True,
                                   **({"SWAP_TMA": True} if t else {}), **PF}
                for bm, bn in SWAP_TILES for t in ("", "t")}
SWAP_KERNELS.update({f"{bm}x{bn}": {"BLK_M": bm, "BLK_N": bn, **PF}
                     for bm, bn in ((128, 160), (128, 168), (128, 192), (64, 128))})
# the shortk set: many tokens on a short or mid-size K. Fitting shapes first, then the two
# held-out shapes of this class (3152x2304x768 ViT-B/16 qkv at 16 images, 1500x3840x1280
# Whisper-large encoder qkv), which a rule fitted here is then read against.
SHORTK_SHAPES = ((6304, 2304, 768), (6304, 3072, 768), (8192, 2304, 768), (8192, 3072, 768),
                 (8192, 768, 768), (4400, 2304, 768), (4096, 3072, 1024),
                 (4096, 4096, 1024), (4096, 1024, 1024), (2560, 3072, 1024),
                 (2560, 4096, 1024), (3000, 3840, 1280), (3000, 5120, 1280),
                 (2048, 5120, 1280), (1024, 5120, 640), (2048, 5120, 640), (6000, 640, 2560),
                 (3152, 2304, 768), (1500, 3840, 1280))
# label -> keywords; "step" names a step built per (N, K) with matmul's keywords for it
SHORTK_KERNELS = {"v9": {"step": "v9"}, "v10": {"step": "v10"}}
SHORTK_KERNELS.update({f"128x{bn}": {"BLK_M": 128, "BLK_N": bn, **PF}
                       for bn in (128, 144, 160, 176, 192, 208, 224, 240, 256)})
SHORTK_KERNELS["64x256"] = {"BLK_M": 64, "BLK_N": 256, **PF}
SHORTK_KERNELS.update({f"128x{bn}wt": {"BLK_M": 128, "BLK_N": bn, "SWAP_AB": True,
                                       "SWAP_TMA": True, **PF} for bn in (144, 176, 208, 240)})
# the midk set: the same kernels at a K of 1536-2560 (many tokens): Qwen2-1.5B, GPT-2 XL,
# Llama-3.2-1B, Phi-2 layers at 2048-8192 tokens, and 2304^3
MIDK_SHAPES = ((4096, 2048, 1536), (4096, 8960, 1536), (8192, 4800, 1600), (8192, 6400, 1600),
               (4096, 2048, 2048), (4096, 8192, 2048), (2048, 16384, 2048),
               (4096, 7680, 2560), (4096, 10240, 2560), (2304, 2304, 2304))
# the tailtma set: plain tiles whose width is not a multiple of 64 (their last BLK_N % 64
# columns stored element by element from the registers) against TAIL_TMA (those columns
# by stmatrix into a staging tile of their width and one TMA store), at shapes where
# matmul picks such a tile: the models suite's 2304^3 (128x168), 2049x3584x3584 (128x240),
# 1000x10240x8192 (128x216), 1536^3 (128x144), the weight-streaming 64-row tiles, and two
# short-K layers
TAIL_SHAPES = ((2304, 2304, 2304), (2049, 3584, 3584), (1000, 10240, 8192),
               (1536, 1536, 1536), (4096, 1280, 1280), (3000, 5120, 2048),
               (128, 6144, 4096), (128, 10240, 8192), (128, 14336, 4096), (128, 28672, 8192))
TAIL_TILES = ((64, 96), (64, 160), (64, 224), (128, 144), (128, 160), (128, 168),
              (128, 176), (128, 216), (128, 224), (128, 240))
TAIL_KERNELS = {f"{bm}x{bn}{t}": {"BLK_M": bm, "BLK_N": bn,
                                  **({"TAIL_TMA": True} if t else {}), **PF}
                for bm, bn in TAIL_TILES for t in ("", "t")}
# the tailshare set: tiles whose tail staging tile of its own would cost the ring a stage, so
# that TAIL_TMA lays it over the last chunk's staging tile (the builder's TAIL_SHARED; wait
# for that chunk's store, then write): element stores against the shared tail, at
# weight-streaming shapes (where a lost stage had cost 4-8%) and at shapes matmul gives them
SHARE_SHAPES = ((2304, 2304, 2304), (128, 14336, 4096), (128, 10240, 8192), (128, 6144, 4096),
                (768, 3584, 3584), (512, 3584, 3584), (1500, 4544, 18176), (4096, 7680, 2560))
SHARE_TILES = ((64, 176), (64, 224), (128, 168), (128, 176), (128, 208))
SHARE_KERNELS = {f"{bm}x{bn}{t}": {"BLK_M": bm, "BLK_N": bn,
                                   **({"TAIL_TMA": True} if t else {}), **PF}
                 for bm, bn in SHARE_TILES for t in ("", "t")}
# the midm set: a few hundred tokens on a K of 3584-13824 (Qwen2.5, Llama-3.2-3B, Falcon,
# Llama-2 layers at 200-512 tokens), where matmul's 64-row tiles trail torch most among
# real-model layers (lab/tail_tma_store/records/matmul_graph_h200_tailtma.jsonl) and cuBLAS runs swapped
# tiles (128 weight rows by 72-200 tokens, pairs along the weight:
# lab/cublas_kernels/records/cublas_kernels_heldout_h200.jsonl): plain tiles against swap-AB tiles stored
# by TMA (SWAP_TMA; "wt": 64 or 128 weight rows by 64-176 tokens)
MIDM_SHAPES = ((333, 3584, 3584), (512, 3072, 8192), (200, 4608, 3584), (256, 5120, 13824),
               (256, 7168, 5120), (333, 4672, 4544), (500, 2304, 9216), (384, 4096, 4096),
               (300, 8192, 8192), (256, 22016, 4096))
MIDM_KERNELS = {f"{bm}x{bn}": {"BLK_M": bm, "BLK_N": bn, **PF,
                               **({"TAIL_TMA": True} if chooser.tail_tma(bm, bn) else {})}
                for bm, bn in ((64, 144), (64, 160), (64, 176), (64, 208), (64, 224),
                               (128, 96), (128, 128), (128, 168), (128, 192))}
MIDM_KERNELS.update({f"{bm}x{bn}wt": {"BLK_M": bm, "BLK_N": bn, "SWAP_AB": True,
                                      "SWAP_TMA": True, **PF}
                     for bm, bn in ((128, 64), (128, 80), (128, 96), (128, 112), (128, 128),
                                    (128, 176), (64, 112), (64, 176))})
# the swpair set: the midm shapes again, swap-AB CTA pairs stored by TMA (SWAP_AB, SWAP_TMA,
# CLUSTER=2: two CTAs of consecutive weight-row blocks share the token tile by multicast, as
# cuBLAS's 2x1 / 4x1 clusters along the weight do there: lab/split_k_decode/records/cublas_kernels_midm_h200.jsonl)
# beside midm's fastest plain and swapped one-CTA tiles
SWPAIR_KERNELS = {k: MIDM_KERNELS[k] for k in ("64x144", "64x160", "64x176", "64x208",
                                                 "64x224", "128x96", "128x80wt", "128x112wt",
                                                 "128x176wt", "64x176wt")}
SWPAIR_KERNELS.update({f"{bm}x{bn}wtc2": {"BLK_M": bm, "BLK_N": bn, "SWAP_AB": True,
                                          "SWAP_TMA": True, "CLUSTER": 2}
                       for bm, bn in ((64, 96), (64, 128), (64, 176), (64, 256), (128, 64),
                                      (128, 80), (128, 96), (128, 112), (128, 128),
                                      (128, 144), (128, 176))})
# the m129 set: 129 tokens on a 4096x4096 weight ran 20.4 us against 16.5 at 160 tokens with
# the same swapped 64x80 kernel and the same grid (lab/swap_ab_tma_store/records/matmul_graph_h200_dpswaplow.jsonl):
# the kernels of 128-160 tokens, with and without PDL, at token counts around it
M129_SHAPES = ((128, 4096, 4096), (129, 4096, 4096), (130, 4096, 4096), (136, 4096, 4096),
               (144, 4096, 4096), (160, 4096, 4096), (129, 8192, 3584), (160, 8192, 3584))
M129_KERNELS = {
    "64x80wtp": {"BLK_M": 64, "BLK_N": 80, "SWAP_AB": True, "SWAP_TMA": True, "PDL": True,
                 **PF},
    "64x80wt": {"BLK_M": 64, "BLK_N": 80, "SWAP_AB": True, "SWAP_TMA": True, **PF},
    "64x96t": {"BLK_M": 64, "BLK_N": 96, "TAIL_TMA": True, **PF},
    "64x96tp": {"BLK_M": 64, "BLK_N": 96, "TAIL_TMA": True, "PDL": True, **PF},
    "64x64p": {"BLK_M": 64, "BLK_N": 64, "PDL": True, **PF},
    "64x64": {"BLK_M": 64, "BLK_N": 64, **PF},
}
# ... and each with SHIFT_LAST ("s": a last token tile that would reach past M ends at M);
# run() compares each "s" kernel's D with its plain twin's bit for bit
M129_KERNELS = with_shift_twins(M129_KERNELS)
# the oob set: where SHIFT_LAST pays. Token counts that leave the last token tile 1-56 rows
# short of full or fill it, on three weights, one-CTA tiles with and without SHIFT_LAST
# (each "s" kernel checked bit for bit against its twin)
OOB_SHAPES = ((129, 4096, 4096), (160, 4096, 4096), (193, 4096, 4096), (200, 4096, 4096),
              (240, 4096, 4096), (256, 4096, 4096), (129, 3584, 3584), (200, 3584, 3584),
              (320, 3584, 3584), (333, 3584, 3584), (192, 4608, 3584), (200, 4608, 3584))
OOB_KERNELS = {f"{bm}x{bn}{'w' if swap else ''}": {
    "BLK_M": bm, "BLK_N": bn, **PF,
    **({"SWAP_AB": True, "SWAP_TMA": True} if swap else {}),
    **({"TAIL_TMA": True} if not swap and chooser.tail_tma(bm, bn) else {})}
    for bm, bn, swap in ((64, 96, False), (64, 144, False), (64, 176, False),
                         (128, 128, False), (64, 80, True))}
OOB_KERNELS = with_shift_twins(OOB_KERNELS)
# the oobpick set: SHIFT_LAST on matmul's own 64-row picks at real-model shapes with a short
# last token tile (lab/shift_last_token_tile/suites/shift.json), both dtypes, each beside its twin in the
# same run (through matmul, fp16 read 0.01-0.04 behind at two of them, bf16 level)
OOBPICK_SHAPES = ((333, 3584, 3584), (200, 4608, 3584), (333, 4672, 4544), (144, 7168, 5120),
                  (1000, 1000, 1000), (500, 2304, 9216), (100, 16384, 3072))
OOBPICK_KERNELS = {f"{bm}x{bn}": {"BLK_M": bm, "BLK_N": bn, **PF,
                                  **({"TAIL_TMA": True} if chooser.tail_tma(bm, bn) else {})}
                   for bm, bn in ((64, 176), (64, 144), (64, 224), (64, 128), (64, 256))}
OOBPICK_KERNELS = with_shift_twins(OOBPICK_KERNELS)
# the tok8 set: decode token tiles sized to the tokens, as cuBLAS's are (40 for 37 tokens, 24
# for 24: lab/cublas_kernels/records/cublas_kernels_heldout_h200.jsonl), against SWAP_AB_TILES' next size
# up (48, 32, 80), with matmul's keywords for these shapes (non-persistent SPLIT_K=1 at
# PIPE_DEPTH 8, or the persistent kernel with PDL): fewer zero-filled token rows per load
TOK8_SHAPES = ((37, 14336, 4096), (24, 15360, 5120), (20, 14336, 4096), (40, 8192, 8192),
               (33, 14336, 4096), (70, 7168, 2048), (65, 7168, 2048))
_NP = {"SWAP_AB": True, "SPLIT_K": 1, "PIPE_DEPTH": 8, "SHIFT_LAST": True, **PF}
TOK8_KERNELS = {f"np64x{bn}": {"BLK_M": 64, "BLK_N": bn, **_NP} for bn in (24, 32, 40, 48)}
TOK8_KERNELS.update({f"np64x{bn}p": {"BLK_M": 64, "BLK_N": bn, "PDL": True, **_NP}
                     for bn in (40, 48)})
TOK8_KERNELS.update({f"64x{bn}wp": {"BLK_M": 64, "BLK_N": bn, "SWAP_AB": True, "PDL": True,
                                    "SHIFT_LAST": True, **PF} for bn in (72, 80)})
# tok8b: the same question at the sizes between tok8's (56 against 64, 88 against 96)
TOK8B_SHAPES = ((50, 14336, 4096), (56, 8192, 8192), (53, 7168, 2048), (85, 7168, 2048),
                (88, 14336, 4096), (81, 8192, 8192))
_SW = {"SWAP_AB": True, "SHIFT_LAST": True, **PF}  # matmul's persistent swap-AB there
TOK8B_KERNELS = {f"{bm}x{bn}w{p}": {"BLK_M": bm, "BLK_N": bn, **_SW,
                                    **({"PDL": True} if p else {})}
                 for bm, bn, p in ((128, 56, ""), (128, 64, ""), (64, 56, ""), (64, 64, ""),
                                   (64, 56, "p"), (64, 64, "p"), (64, 88, "p"), (64, 96, "p"),
                                   (128, 88, ""), (128, 96, ""), (64, 88, ""), (64, 96, ""))}
# the nk set: matmul's kernel at 256x5120x13824 (64x160, RUNTIME_NK, TAIL_TMA, PREFETCH_MAPS,
# SHIFT_LAST) read 0.84-0.87 alternated with torch through matmul (three held-out runs), while a 64x160
# built for that N and K without the three options read 0.95-0.96 alternated with torch in
# the pair-along-N sweep (lab/cta_clusters/records/v12_pairn_h200.jsonl): the same tile with and without
# each difference, at the shapes matmul gives 64x160, 64x224 and 64x96 ("RUNTIME_NK": False:
# built per (N, K) of the set's shapes, as v9 and v10 are)
NK_SHAPES = ((256, 5120, 13824), (128, 10240, 8192), (256, 7168, 5120), (128, 14336, 4096),
             (128, 6144, 4096))
_PICK = {"TAIL_TMA": True, "SHIFT_LAST": True, **PF}
NK_KERNELS = {
    "64x160r": {"BLK_M": 64, "BLK_N": 160, **_PICK},
    "64x160r0": {"BLK_M": 64, "BLK_N": 160},
    "64x160rf": {"BLK_M": 64, "BLK_N": 160, **PF},
    "64x160s": {"BLK_M": 64, "BLK_N": 160, "RUNTIME_NK": False},
    "64x160st": {"BLK_M": 64, "BLK_N": 160, "RUNTIME_NK": False, **_PICK},
    "64x224r": {"BLK_M": 64, "BLK_N": 224, "SHIFT_LAST": True, **PF},
    "64x224s": {"BLK_M": 64, "BLK_N": 224, "RUNTIME_NK": False, "SHIFT_LAST": True, **PF},
    "64x96r": {"BLK_M": 64, "BLK_N": 96, **_PICK},
    "64x96s": {"BLK_M": 64, "BLK_N": 96, "RUNTIME_NK": False, **_PICK},
}
SETS = {"streaming": (SHAPES, KERNELS), "pairs": (PAIR_SHAPES, PAIR_KERNELS),
        "swaptma": (SWAP_SHAPES, SWAP_KERNELS), "shortk": (SHORTK_SHAPES, SHORTK_KERNELS),
        "midk": (MIDK_SHAPES, SHORTK_KERNELS), "tailtma": (TAIL_SHAPES, TAIL_KERNELS),
        "tailshare": (SHARE_SHAPES, SHARE_KERNELS), "midm": (MIDM_SHAPES, MIDM_KERNELS),
        "swpair": (MIDM_SHAPES, SWPAIR_KERNELS), "m129": (M129_SHAPES, M129_KERNELS),
        "oob": (OOB_SHAPES, OOB_KERNELS), "oobpick": (OOBPICK_SHAPES, OOBPICK_KERNELS),
        "tok8": (TOK8_SHAPES, TOK8_KERNELS), "tok8b": (TOK8B_SHAPES, TOK8B_KERNELS),
        "nk": (NK_SHAPES, NK_KERNELS)}


def export(out: Path, dtypes, kernels=KERNELS, shapes=SHAPES) -> int:
    from tirx_gemm import registry
    from tirx_gemm.op import keywords as matmul_choice
    from tirx_gemm.compile import bundle
    step = registry.get("v12", "sm_90a")
    reqs = []
    for dt in dtypes:
        for kw in kernels.values():
            if "step" in kw:  # v9 / v10: runtime M, matmul's keywords
                built = registry.get(kw["step"], "sm_90a")
                k = matmul_choice.step_kwargs(built, dt, BASE["SM_COUNT"])
            else:
                built, k = step, {**BASE, **kw, **({} if dt == "float16" else {"dtype": dt})}
            if "step" in kw or kw.get("RUNTIME_NK") is False:  # built per (N, K) of the set
                reqs += [(built, (matmul_choice.NOMINAL_M, N, K), k)
                         for N, K in sorted({(N, K) for _, N, K in shapes})]
            else:
                reqs.append((built, (128, 256, 256), k))
    lab_patches.require([k for built, _, k in reqs if built is step])
    bundle.export(reqs, out, ffi_wheel_python="3.12")
    return 0


def _label(kw: dict, kernels=KERNELS, step: str = "v12") -> str | None:
    if step != "v12":
        return next((name for name, want in kernels.items() if want.get("step") == step),
                    None)
    core = {k: v for k, v in kw.items() if k not in BASE and k != "dtype"}
    if kw.get("RUNTIME_NK") is False:
        core["RUNTIME_NK"] = False
    return next((name for name, want in kernels.items() if want == core), None)


def run(bundle: Path, out: Path, dtypes, budget_s: float, set_name: str = "streaming",
        pairwise: bool = False) -> int:
    import torch
    from tirx_gemm.bundle_format import code_git_sha
    from tirx_gemm.compile.bundle import load_manifest
    from tirx_gemm.gitinfo import git_sha
    from tirx_gemm.run.launcher import synchronize
    from tirx_gemm.run.loader import load_kernel
    t0 = time.time()
    kernels, per_nk = {}, {}  # per_nk: (dtype, name) -> {(N, K): kernel} (v9, v10)
    for e in load_manifest(bundle):
        kw = e.get("kwargs") or {}
        name = _label(kw, SETS[set_name][1], e["step"])
        if not name:
            continue
        key = (kw.get("dtype", "float16"), name)
        if e["step"] == "v12" and kw.get("RUNTIME_NK") is not False:
            kernels[key] = load_kernel(str(bundle / e["lib"]))
        else:
            per_nk.setdefault(key, {})[(e["N"], e["K"])] = str(bundle / e["lib"])
            kernels[key] = None
    dev = torch.cuda.get_device_name()
    sha = code_git_sha(bundle) or git_sha()
    bad = 0
    for M, N, K in SETS[set_name][0]:
        for dtype in dtypes:
            if time.time() - t0 > budget_s:
                print(f"budget of {budget_s:.0f} s spent: stopping before {M}x{N}x{K}")
                return 1 if bad else 0
            ins, ref, pick, _ = _inputs(M, N, K, dtype, time_torch=False)
            names, fns = ["torch"], [[lambda a=a, b=b, d=d: torch.mm(a, b.t(), out=d)
                                      for a, b, d in pick]]
            rec = {"M": M, "N": N, "K": K, "dtype": dtype, "device": dev,
                   "torch": torch.__version__, "git_sha": sha, "timing": "interleaved",
                   "set": set_name,
                   "date": time.strftime("%Y-%m-%d"), "candidates": {}}
            outs = {}  # name -> D of the first input set (SHIFT_LAST's bitwise check)
            for (dt, name), kern in sorted(kernels.items()):
                if dt != dtype:
                    continue
                if kern is None:  # built per (N, K)
                    lib = per_nk[(dt, name)].get((N, K))
                    if lib is None:
                        continue
                    kern = load_kernel(lib)
                a, b, d = ins[0]
                d.fill_(float("nan"))
                try:
                    kern(a, b, d)
                    synchronize(f"v12 {name} {M}x{N}x{K}")
                except Exception as exc:  # noqa: BLE001 - recorded
                    rec["candidates"][name] = {"error": str(exc).splitlines()[0]}
                    bad += 1
                    continue
                ok, rel = _check(d, ref, dtype)
                rec["candidates"][name] = {"ok": ok, "rel_err": rel}
                outs[name] = d.clone()
                twin = outs.get(name[:-1]) if name.endswith("s") else None
                if twin is not None:  # SHIFT_LAST: the same bits as without it
                    same = bool(torch.equal(d.view(torch.int16), twin.view(torch.int16)))
                    rec["candidates"][name]["same_bits_as"] = [name[:-1], same]
                    if not same:
                        ok = False
                        rec["candidates"][name]["ok"] = False
                if not ok:
                    bad += 1
                    continue
                names.append(name)
                fns.append([lambda a=a, b=b, d=d, k=kern: k(a, b, d) for a, b, d in pick])
            if pairwise:  # each kernel alternated with torch alone, as matmul is timed
                rec["timing"] = "interleaved-pairwise"
                for name, fn in zip(names[1:], fns[1:]):
                    w0 = time.time()  # wall span: to join with a clock log (nvidia-smi)
                    t_torch, t = _graphs_interleaved([fns[0], fn])
                    rec["candidates"][name].update(torch_ms=t_torch, ms=t, ratio=t_torch / t,
                                                   wall=[w0, time.time()])
                    rec["torch_ms"] = t_torch
            else:
                times = _graphs_interleaved(fns)
                rec["torch_ms"] = times[0]
                for name, t in zip(names[1:], times[1:]):
                    rec["candidates"][name].update(ms=t, ratio=times[0] / t)
            line = " ".join(f"{n}:{rec['candidates'][n]['ratio']:.2f}" for n in names[1:])
            print(f"{M}x{N}x{K:<6} {dtype:8} torch {rec['torch_ms'] * 1e3:7.1f} us | {line}",
                  flush=True)
            with open(out, "a") as f:
                f.write(json.dumps(rec) + "\n")
            del ins, ref, fns
    print(f"done in {time.time() - t0:.0f} s; device {dev}; {bad} wrong or failed")
    return 1 if bad else 0


def _smi_log(path: Path) -> list[tuple[float, float, float]]:
    """(unix time, SM MHz, W) rows of ``nvidia-smi --query-gpu=timestamp,clocks.sm,
    power.draw,... --format=csv,noheader`` (the GPU host's clock is UTC)."""
    from datetime import datetime, timezone
    rows = []
    for line in path.read_text().splitlines():
        f = [x.strip() for x in line.split(",")]
        try:
            t = datetime.strptime(f[0], "%Y/%m/%d %H:%M:%S.%f").replace(tzinfo=timezone.utc)
            rows.append((t.timestamp(), float(f[1].split()[0]), float(f[2].split()[0])))
        except (ValueError, IndexError):
            continue
    return rows


def clocks(records: Path, smi: Path, out: Path) -> int:
    """Each pairwise kernel's median SM clock and power over the second half of its wall
    span (after the warm-up: the replays that were timed) from the nvidia-smi log, added to
    the records as ``sm_mhz`` and ``power_w``."""
    import statistics
    rows = _smi_log(smi)
    lines = []
    for line in records.read_text().splitlines():
        rec = json.loads(line)
        for c in rec["candidates"].values():
            if "wall" not in c:
                continue
            span = [r for r in rows if c["wall"][0] <= r[0] <= c["wall"][1]]
            timed = span[len(span) // 2:]
            if timed:
                c["sm_mhz"] = statistics.median(r[1] for r in timed)
                c["power_w"] = round(statistics.median(r[2] for r in timed), 1)
        lines.append(json.dumps(rec))
    out.write_text("\n".join(lines) + "\n")
    print(f"{len(lines)} records with clocks -> {out}")
    return 0


def main(argv) -> int:
    p = argparse.ArgumentParser()
    sub = p.add_subparsers(dest="cmd", required=True)
    e = sub.add_parser("export")
    e.add_argument("--out", type=Path, required=True)
    e.add_argument("--dtypes", default="bfloat16")
    e.add_argument("--set", choices=sorted(SETS), default="streaming")
    r = sub.add_parser("run")
    r.add_argument("--bundle", type=Path, required=True)
    r.add_argument("--out", type=Path, required=True)
    r.add_argument("--dtypes", default="bfloat16")
    r.add_argument("--budget-s", type=float, default=300)
    r.add_argument("--set", choices=sorted(SETS), default="streaming")
    r.add_argument("--pairwise", action="store_true",
                   help="time each kernel alternated with torch.mm alone (the last torch time "
                        "is the record's torch_ms; each kernel's is kept beside it)")
    c = sub.add_parser("clocks", help="add each kernel's SM clock and power (from the "
                                        "nvidia-smi log h200_pairs.sh writes) to the records")
    c.add_argument("--records", type=Path, required=True)
    c.add_argument("--smi", type=Path, required=True)
    c.add_argument("--out", type=Path, required=True)
    a = p.parse_args(argv)
    if a.cmd == "clocks":
        return clocks(a.records, a.smi, a.out)
    if a.cmd == "export":
        return export(a.out, a.dtypes.split(","), SETS[a.set][1], SETS[a.set][0])
    return run(a.bundle, a.out, a.dtypes.split(","), a.budget_s, a.set, a.pairwise)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
