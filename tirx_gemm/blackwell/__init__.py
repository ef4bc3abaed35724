"""Blackwell (sm_100a) building blocks: the tcgen05 engine, the twin of :mod:`tirx_gemm.hopper`.

On Blackwell one thread issues ``tcgen05.mma`` for the whole tile, the operands are read
from shared memory, and the fp32 accumulator lives in *tensor memory* (TMEM, 128 lanes x
512 columns per SM), allocated and freed by one warp. Completion is signalled by
``tcgen05.commit`` arriving on an mbarrier, and TMEM is read back with ``tcgen05.ld``.
The pieces every sm_100a step needs live in this package once, one module per job:

* ``tcgen05``: TMEM allocation and the accumulator view, the setup publication
  (``publish_setup``, ``publish_smem_writes``, ``reclaim_smem``), the MMA issue and commit
  verbs, the tcgen05 fences, ``tmem_to_fp32``, ``tmem_to_registers``,
* ``stores``: the epilogues (TMEM -> GMEM, or registers -> swizzled SMEM -> one TMA store
  of a tile, a band of rows or a 128-byte box) and the guarded row stores,
* ``cluster``: the 2-CTA (``cta_group::2``) forms of v8 / v9 (pair-wide TMEM, cluster
  setup, the pair's MMA, commit and TMA loads),
* ``clc``: v10's Cluster Launch Control scheduler (``W.ClusterLaunchControl``),
* ``fused``: the fused epilogue (bias, activation, SwiGLU in fp32) and
  ``without_operand``,
* ``fp8``: v13's e4m3 constants and scaled epilogue, MXFP8's block scale factors,
* ``grouped``: v14's walk (sm_90a's, re-exported), bounded stores and fused epilogue,
* ``layouts``: v15's MN-major operands (TMA boxes, MMA descriptors),
* ``act_grad``: v15's training epilogues (the activation's gradient, the saved z, the bias
  gradient's partial sums), which the step imports as a module (``AG``), as sm_90a's v15
  imports ``hopper.layouts``.
Every other name is re-exported here: a step imports ``from tirx_gemm import blackwell as W``
and calls ``W.<name>`` whichever module holds it, next to :mod:`tirx_gemm.helpers`
(``H``: validation, layouts, barriers, TMA), exactly as the sm_90a steps import
:mod:`tirx_gemm.hopper`; a verb that exists on both arches has one name in both packages
(``W.publish_setup``, ``W.publish_smem_writes``, ``W.mma_commit``).

Everything that runs on the device is an ``@T.inline`` helper: it is expanded at the call
site, so the generated CUDA is the same as if the step had written it inline.
"""

from __future__ import annotations

from ..helpers import ACC_DTYPE  # noqa: F401 (W.ACC_DTYPE, as hopper's W has it)
from .clc import CLC_NO_TILE, CLC_RESPONSE_BYTES, ClusterLaunchControl, clc_try_cancel  # noqa: F401
from .cluster import (  # noqa: F401
    CTA_PAIR, check_even_sm_count, mma_commit_pair, mma_tile_pair, publish_setup_cluster,
    tcgen05_cluster_sync, tma_load_pair, tmem_alloc_pair, tmem_free_pair)
from .fp8 import (  # noqa: F401
    FP8_BLK_K, FP8_MMA_DTYPE, FP8_OUT_DTYPES, FP8_SCALES, FP8_STORAGE, MX_SF_ATOM_BYTES,
    MX_SF_BOX, MX_SF_DTYPE, MX_SF_K, MX_SF_ROWS, MX_SF_STORAGE, MX_SF_VEC, fp8_scaled_chunk,
    mma_tile_mx, mma_tile_mx_pair, mx_sf_cols, mx_sf_gmem_shape, mx_sf_layouts, mx_sf_tmem,
    mx_sf_to_tmem, mx_sf_to_tmem_pair)
from .grouped import (BOUND_ROWS, E_MAX, LAYOUTS, load_sfa_atom, log2_ceil, scan_experts, store_column_bounded, store_row_bounded, store_unit_bounded, store_unit_epilogue, tile_at, tma_load_gate_up, tma_load_mx_unit, tma_load_unit, weight_shape)  # noqa: F401,E501
from .layouts import (MAJORS, check_layout_shape, check_major, expect_stage_bytes, mma_tile_major, smem_shape, tma_load_operand)  # noqa: F401,E501
from .fused import (  # noqa: F401
    _ERFC_P, EPI_ROW_BYTES, TMEM_READ_N, _erfc_nonneg, activation, epilogue_chunks,
    fused_epilogue_chunk, without_operand)
from .stores import (  # noqa: F401
    epilogue_to_gmem, epilogue_to_tma_store, store_row_guarded, store_rows_box_via_tma,
    store_rows_via_tma, store_tile_via_tma)
from .tcgen05 import (  # noqa: F401
    TMEM_COLS, mma_commit, mma_tile, mma_tile_at, publish_setup, publish_smem_writes,
    reclaim_smem, tcgen05_cta_sync, tcgen05_fence_after_sync, tcgen05_fence_before_sync,
    tmem_accumulator, tmem_alloc, tmem_free, tmem_to_fp32, tmem_to_registers)

# the names the single blackwell.py defined, in its order
__all__ = [
    "TMEM_COLS",
    "tmem_accumulator",
    "tmem_alloc",
    "tcgen05_cta_sync",
    "tmem_free",
    "publish_setup",
    "publish_smem_writes",
    "reclaim_smem",
    "mma_commit",
    "mma_tile",
    "tmem_to_registers",
    "epilogue_to_gmem",
    "store_tile_via_tma",
    "epilogue_to_tma_store",
    "store_row_guarded",
    "mma_tile_at",
    "tcgen05_fence_after_sync",
    "tcgen05_fence_before_sync",
    "CTA_PAIR",
    "check_even_sm_count",
    "tmem_alloc_pair",
    "tmem_free_pair",
    "tcgen05_cluster_sync",
    "publish_setup_cluster",
    "mma_commit_pair",
    "mma_tile_pair",
    "tma_load_pair",
    "store_rows_via_tma",
    "CLC_NO_TILE",
    "CLC_RESPONSE_BYTES",
    "clc_try_cancel",
    "ClusterLaunchControl",
    "EPI_ROW_BYTES",
    "TMEM_READ_N",
    "epilogue_chunks",
    "activation",
    "fused_epilogue_chunk",
    "store_rows_box_via_tma",
    "without_operand",
    "FP8_BLK_K",
    "FP8_STORAGE",
    "FP8_MMA_DTYPE",
    "FP8_OUT_DTYPES",
    "FP8_SCALES",
    "fp8_scaled_chunk",
    "MX_SF_VEC",
    "MX_SF_STORAGE",
    "MX_SF_DTYPE",
    "MX_SF_ROWS",
    "MX_SF_K",
    "MX_SF_ATOM_BYTES",
    "MX_SF_BOX",
    "mx_sf_cols",
    "mx_sf_gmem_shape",
    "mx_sf_layouts",
    "mx_sf_tmem",
    "mx_sf_to_tmem",
    "mx_sf_to_tmem_pair",
    "mma_tile_mx",
    "mma_tile_mx_pair",
]
