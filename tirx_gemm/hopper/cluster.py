"""Clusters of two CTAs (v8, v9): B multicast by TMA, the cluster-wide setup, a stage released in both CTAs."""

from __future__ import annotations

from tvm.script import tirx as T
from tvm.script.tirx import tile as Tx

from tirx_gemm import spec

from .. import helpers as H
from .. import timeline as TL  # event hooks: None (nothing emitted) unless TIMELINE=True
from .wgmma import ELEM_BYTES

# v8 and v9 launch CTAs in clusters of CLUSTER_SIZE = 2 (cluster dims (2, 1, 1), from
# T.cta_id_in_cluster): the two CTAs of a cluster compute vertically adjacent tiles, so
# they need the same B slice at every K step; each loads half of it and the TMA unit
# multicasts that half into both CTAs' shared memory. A CTA can address its peer's
# shared memory through the cluster's shared-memory window (mapa), which is how a
# consumer releases a stage in both CTAs.

CLUSTER_SIZE = spec.CLUSTER_SIZE  # 2
CLUSTER_MASK = (1 << CLUSTER_SIZE) - 1  # multicast to every CTA of the cluster (0b11)


@T.inline
def _publish_setup_cluster():
    # publish_setup for a cluster: the peer CTA completes bytes on this CTA's full
    # barriers (multicast TMA) and arrives on its empty barriers, so the inits must be
    # visible cluster-wide (release/acquire cluster barrier) before either CTA starts
    T.ptx["fence.mbarrier_init.release.cluster"]()
    T.cuda.cluster_sync()


def publish_setup_cluster():
    """publish_setup for a cluster (every thread, once, at the top level); a TIMELINE build
    starts its recording here too."""
    TL.setup()
    return _publish_setup_cluster()


@T.inline
def tma_load_multicast_b(Asmem, Bsmem_half, A, B, m_st, nb_st, k_st, BLK_M, B_ROWS, BLK_K,
                         BLK_N, bar, mask=CLUSTER_MASK):
    # one thread per CTA: expect every byte that lands in THIS CTA's stage (own A tile +
    # the whole BLK_N-row B tile, half of it written by the peer's multicast), then load
    # the own A tile (unicast) and B rows [nb_st, nb_st + B_ROWS) multicast into the same
    # offset of both CTAs, completing on the barrier at the same offset in each. Boxes
    # that reach past A's or B's edge are zero-filled and still count all their bytes: a
    # CTA whose rows all lie past M loads zeros, and its B half still feeds the peer.
    # `mask`: the cluster's CTAs (v12's clusters of 4: 0b1111); B_ROWS 0 (a CTA of such a
    # cluster whose share of an uneven tile is empty): the own tile only
    TL.point(TL.TMA_ISSUE, k_st // BLK_K, TL.PRODUCER)
    T.ptx.mbarrier.arrive.expect_tx.shared.b64(
        bar, T.uint32((BLK_M + BLK_N) * BLK_K * ELEM_BYTES))
    Tx.copy_async(Asmem, A[m_st:m_st + BLK_M, k_st:k_st + BLK_K], dispatch=H.TMA, mbar=bar)
    if B_ROWS > 0:
        Tx.copy_async(Bsmem_half, B[nb_st:nb_st + B_ROWS, k_st:k_st + BLK_K],
                      dispatch=H.TMA, mbar=bar, cta_mask=mask)


# mapa turns this CTA's shared address of a barrier into the address of the same barrier
# in CTA `cta` of the cluster (shared::cluster window). The arrive keeps PTX's default
# semantics (release at CTA scope), as CUTLASS's cluster barriers do: what it publishes
# is that this warpgroup's wgmmas finished reading the stage, which wgmma.wait_group
# already guarantees. `.release.cluster` would compile to MEMBAR.ALL.GPU before every
# arrival, i.e. once per K step on the consumers' critical path.
_ARRIVE_CLUSTER_SRC = """
__device__ __forceinline__ void tirx_gemm_arrive_cluster(void* bar, int cta) {
  unsigned int local = (unsigned int)__cvta_generic_to_shared(bar);
  asm volatile("{ .reg .b32 remote; "
               "mapa.shared::cluster.u32 remote, %0, %1; "
               "mbarrier.arrive.shared::cluster.b64 _, [remote]; }"
               :: "r"(local), "r"(cta) : "memory");
}
"""


@T.inline
def release_stage_in_cluster(mma2tma, stage, tid_in_wg, size=CLUSTER_SIZE):
    # one consumer warpgroup is done reading `stage` (after its wgmma.wait_group): threads
    # 0 .. size-1 each arrive on the stage's empty barrier in CTA tid_in_wg, so the
    # producer of every CTA whose multicast writes this stage learns it is free
    if tid_in_wg < size:
        T.cuda.func_call("tirx_gemm_arrive_cluster", mma2tma.buf.ptr_to([stage]), tid_in_wg,
                         source_code=_ARRIVE_CLUSTER_SRC)
        TL.point(TL.RELEASE, stage)
