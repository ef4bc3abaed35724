"""The CTA pair (cta_group::2) of v8, v9, v10, v13: pair-wide TMEM, cluster setup, MMA, commit, TMA loads."""

from __future__ import annotations

from tvm.script import tirx as T
from tvm.script.tirx import tile as Tx

from tirx_gemm import spec  # absolute: a hookless copy of this file reads the package's
from ..helpers import TMA, check_positive_ints
from .tcgen05 import TMEM_COLS


# --- 2-CTA (cta_group::2) helpers (v8, v9; v10 and v13 run on the same pair) ---
# A cluster of two CTAs (a "CTA pair") shares one tcgen05.mma: CTA 0 issues it with
# cta_group::2, the tensor cores read A and B from both CTAs' SMEM and write each CTA's
# 128 rows into that CTA's TMEM. Everything that owns pair-wide state (TMEM allocation,
# commits, barriers another CTA signals) uses the 2-CTA forms below.
CTA_PAIR = spec.CLUSTER_SIZE  # 2: CTAs per cluster in v8 / v9 / v10 / v13


def check_even_sm_count(SM_COUNT: int) -> None:
    check_positive_ints(SM_COUNT=SM_COUNT)
    if SM_COUNT % CTA_PAIR != 0:
        raise ValueError(f"SM_COUNT={SM_COUNT} is not a multiple of the cluster size "
                         f"{CTA_PAIR}: the persistent pool is made of CTA pairs")


@T.inline
def tmem_alloc_pair(tmem_addr):
    # one warp in EACH CTA of the pair runs it; both get the same column range, so the
    # pair-wide MMA can address "the same" accumulator columns in both TMEMs
    T.ptx["tcgen05.alloc.cta_group::2.sync.aligned.shared::cta.b32"](
        T.address_of(tmem_addr[0]), T.uint32(TMEM_COLS))


@T.inline
def tmem_free_pair(tmem_addr):
    # by the allocating warp of each CTA, after tcgen05_cluster_sync (the peer's MMA may
    # still write this CTA's TMEM until then)
    T.ptx["tcgen05.relinquish_alloc_permit.cta_group::2.sync.aligned"]()
    T.ptx["tcgen05.dealloc.cta_group::2.sync.aligned.b32"](tmem_addr[0], T.uint32(TMEM_COLS))


@T.inline
def tcgen05_cluster_sync():
    # tcgen05_cta_sync across both CTAs of the cluster (barrier.cluster arrive/wait)
    T.ptx["tcgen05.fence::before_thread_sync"]()
    T.cuda.cluster_sync()
    T.ptx["tcgen05.fence::after_thread_sync"]()


@T.inline
def publish_setup_cluster():
    # publish_setup for a CTA pair: the peer arrives on this CTA's barriers (TMA bytes,
    # epilogue arrivals, multicast commits), so the inits and the TMEM address must be
    # visible cluster-wide before either CTA starts its roles
    T.ptx.fence.proxy.async_.shared__cta()
    T.ptx["fence.mbarrier_init.release.cluster"]()
    tcgen05_cluster_sync()


@T.inline
def mma_commit_pair(bar):
    # arrives once on `bar` in BOTH CTAs (cta mask 0b11) when every tcgen05.mma issued so
    # far by this thread has completed: the peer learns about the shared MMA's progress
    T.ptx["tcgen05.commit.cta_group::2.mbarrier::arrive::one.shared::cluster.multicast::cluster.b64"](
        bar, T.uint16(0b11))


@T.inline
def mma_tile_pair(tmem, col, Asmem, Bsmem, MMA_N, accum):
    # one elected thread of CTA 0: M = 256 (128 rows from each CTA's Asmem), N = MMA_N
    # (MMA_N / 2 rows of B from each CTA's Bsmem), into columns [col, col + MMA_N) of
    # both CTAs' TMEM
    Tx.gemm_async(tmem[:, col:col + MMA_N], Asmem, Bsmem, accum=accum, dispatch="tcgen05",
                  cta_group=2)


@T.inline
def tma_load_pair(dst, src, bar_cta0):
    # a TMA copy whose completion (its bytes) is counted on CTA 0's barrier, whichever
    # CTA of the pair issues it: the 2-CTA form takes a barrier in the peer's SMEM. As in
    # tma_load_tiles, a box past the tensor's edge is zero-filled and counts in full
    Tx.copy_async(dst, src, dispatch=TMA, cta_group=2, mbar=bar_cta0)
