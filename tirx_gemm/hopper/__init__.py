"""Hopper (sm_90a) building blocks: the wgmma engine, the twin of :mod:`tirx_gemm.blackwell`.

On Hopper the tensor cores are driven by ``wgmma``: one *warpgroup* (128 threads)
issues ``wgmma.mma_async`` together, the operands are read from shared memory through
64-bit *matrix descriptors*, and the fp32 accumulators live in the registers of the
issuing warpgroup (no TMEM). TIRx 0.27 has no tile primitive that dispatches to wgmma
(``Tx.gemm_async`` targets tcgen05 only), so the steps issue the PTX directly, and the
pieces every step needs live in this package once, one module per job:

* ``wgmma``: the hardware constants, descriptor encoding and the byte arithmetic that
  walks a 128B-swizzled K-major tile, ``wgmma_tile`` (the wgmmas that consume one BLK_K
  slice of A and B), the operand fence that pins accumulator registers behind
  ``wgmma.wait_group``, the wgmma group verbs (``mma_fence``, ``mma_commit``, ``mma_wait``)
  and the setup publication (``publish_setup``, ``publish_smem_writes``), named like their
  sm_100a twins in :mod:`tirx_gemm.blackwell`,
* ``stores``: the fragment epilogue ``store_fragment`` (to GMEM, v1-v3, or to a swizzled
  SMEM tile for a TMA store, v4+), ``tma_store_tile`` (one box per 64-column swizzle atom,
  clipped at D's edges), the packed 16-bit stmatrix tiles of v9's overlapped epilogue,
  v12's narrow tails (guarded stores, or ``store_packed_tail``'s TMA box), fp32 and swap-AB
  stores,
* ``fused``: bias, activation and SwiGLU on the fp32 fragment,
* ``cluster``: v8/v9's CTA pairs (B multicast, cluster-wide setup, stage release),
* ``fp8``: v13's e4m3 wgmma, loads, promotion and scales,
* ``checks``: build-time checks (CTAs per SM, ring depth, register split, cluster pool).
Every name is re-exported here: a step imports ``from tirx_gemm import hopper as W`` and
calls ``W.<name>`` whichever module holds it.
The arch-neutral pieces (validation, layouts, barriers, ``tma_load_tiles``, the bulk-group
verbs, ``ROLLED``) are in :mod:`tirx_gemm.helpers`.

Everything that runs on the device is an ``@T.inline`` helper: it is expanded at the call
site, so the generated CUDA is the same as if the step had written it inline.

Conventions used throughout (16-bit operands, fp16 or bf16, K-major, 128B swizzle; every
byte count below holds for both, and ``dtype`` picks only the wgmma variant and the
conversion of the fp32 accumulators):

* An SMEM operand tile is ``(rows, 64)`` 16-bit elements in
  :func:`tirx_gemm.helpers.swizzled_layout`:
  each row is exactly one 128-byte swizzle row, 8 rows form a 1024-byte swizzle atom,
  atoms are stacked along the rows. Tiles (and pipeline stages) are 1024-byte aligned.
* Descriptor fields are in 16-byte units. For this layout ``SBO = 1024 B`` (distance
  between 8-row groups) and ``LBO`` is unused by the hardware (set to 1, as CUTLASS does).
  The start address is the low 14-bit field, so *adding* ``bytes >> 4`` to an encoded
  descriptor moves its start: +32 B selects the next k16 slice inside the 128-byte row
  (the hardware applies the swizzle to the final address, which is why a plain +32 B
  works inside a swizzled row), +64*128 B = 8192 B selects the next 64-row block.
* Accumulator fragment of ``wgmma m64nNk16 .f32`` for thread (warp ``w`` of the
  warpgroup, lane ``l``): register ``acc[4j + 2h + e]`` (``j < N/8``, ``h, e in {0, 1}``)
  holds ``D[16w + l//4 + 8h, 8j + 2(l%4) + e]`` of the 64 x N block.
"""

from __future__ import annotations

from ..helpers import ACC_DTYPE, AB_DTYPE  # noqa: F401 (W.ACC_DTYPE, as before)
from .checks import (  # noqa: F401
    check_cluster_pool, check_ctas_fit_sm, check_reg_split, check_ring_for_wait_one)
from .cluster import (  # noqa: F401
    _ARRIVE_CLUSTER_SRC, CLUSTER_MASK, CLUSTER_SIZE, _publish_setup_cluster,
    publish_setup_cluster, release_stage_in_cluster, tma_load_multicast_b)
from .fp8 import (  # noqa: F401
    FP8_BLK_K, FP8_OUT_DTYPES, FP8_STORAGE, FP8_WGMMA_K, fp8_tile_bytes, load_block_scales,
    promote_fragment, promote_fragment_block, promote_fragment_block_straddle, scale_fragment,
    scale_fragment_rows_cols, tma_load_fp8_multicast_b, tma_load_fp8_tiles, wgmma_fp8_name, wgmma_fp8_tile)
from .grouped import (E_MAX, LAYOUTS, BOUND_ROWS, log2_ceil, scan_experts, tile_at, tma_load_unit, tma_load_unit_multicast, store_packed_rows, store_transposed_rows, apply_row_epilogue, tma_load_gate_up, tma_load_gate_up_swap, store_transposed_swiglu, swiglu_fragment, tma_load_fp8_unit, walk_stages, walk_tables, start_walk, walk_length, queue_fp8_stage)  # noqa: F401,E501
from .fused import _ACT_FN, epilogue_bias_act, epilogue_swiglu, load_bias_fragment  # noqa: F401
from .layouts import (MAJORS, MN_CHUNK, check_layout_shape, check_major, check_mn_rows, desc_steps, encode_desc_major, expect_stage_bytes, gmem_shape, smem_shape, tma_load_operand, wgmma_tile_major)  # noqa: F401,E501
from .stores import (  # noqa: F401
    _PACK_FN, _ST_GLOBAL_B32_SRC, _ST_GLOBAL_F32X2_SRC, EPI_COLS, pack_fragment,
    stmatrix_chunk, store_fragment, store_fragment_f32_guarded,
    store_fragment_transposed_guarded, store_packed_chunk, store_packed_guarded,
    store_packed_tail, stmatrix_tail,
    store_packed_tile, store_packed_tile_transposed, tma_store_tile)
from .wgmma import (  # noqa: F401
    _FENCE_F32_SRC, _WGMMA_TYPE, DESC_K16_STEP, DESC_LBO, DESC_M64_STEP, DESC_SBO,
    ELEM_BYTES, SMEM_ALIGN, SMEM_PER_SM_BYTES, SMEM_RESERVED_PER_CTA, SWIZZLE_128B,
    SWIZZLE_ROW_ELEMS, WGMMA_K, WGMMA_M, _publish_setup, desc_advance, encode_desc,
    fence_operands, mma_commit, mma_fence, mma_wait, publish_setup, publish_smem_writes,
    tile_bytes, wgmma_name, wgmma_tile)
from .fused import epilogue_bias_act_smem, load_bias_tile_smem  # noqa: F401 (v12's BIAS_SMEM)
from .fused import epilogue_bias_act_rows, load_bias_rows  # noqa: F401 (v12's SWAP_AB bias)
from .fused import epilogue_bias_band  # noqa: F401 (v12's K split: the bias after the sum)
from .grouped import weight_shape  # noqa: F401 (v14: the weight's extents, int64 where needed)

# the list the single hopper.py built, in its order
__all__ = [
    "ACC_DTYPE",
    "DESC_K16_STEP",
    "DESC_M64_STEP",
    "DESC_SBO",
    "SMEM_ALIGN",
    "SWIZZLE_ROW_ELEMS",
    "WGMMA_K",
    "WGMMA_M",
    "check_ctas_fit_sm",
    "check_ring_for_wait_one",
    "desc_advance",
    "encode_desc",
    "fence_operands",
    "mma_commit",
    "mma_fence",
    "mma_wait",
    "publish_setup",
    "store_fragment",
    "tile_bytes",
    "tma_store_tile",
    "wgmma_name",
    "wgmma_tile",
    "CLUSTER_MASK",
    "CLUSTER_SIZE",
    "check_cluster_pool",
    "publish_setup_cluster",
    "release_stage_in_cluster",
    "tma_load_multicast_b",
    "EPI_COLS",
    "pack_fragment",
    "stmatrix_chunk",
    "store_packed_tile",
    "store_packed_chunk",
    "publish_smem_writes",
    "store_packed_guarded",
    "store_packed_tail",
    "stmatrix_tail",
    "load_bias_fragment",
    "epilogue_bias_act",
    "load_bias_tile_smem",
    "epilogue_bias_act_smem",
    "load_bias_rows",
    "epilogue_bias_act_rows",
    "epilogue_swiglu",
    "store_fragment_f32_guarded",
    "store_fragment_transposed_guarded",
    "store_packed_tile_transposed",
    "FP8_BLK_K",
    "FP8_OUT_DTYPES",
    "FP8_STORAGE",
    "FP8_WGMMA_K",
    "fp8_tile_bytes",
    "load_block_scales",
    "promote_fragment",
    "promote_fragment_block",
    "promote_fragment_block_straddle",
    "scale_fragment",
    "scale_fragment_rows_cols",
    "tma_load_fp8_multicast_b",
    "tma_load_fp8_tiles",
    "wgmma_fp8_name",
    "wgmma_fp8_tile",
]
