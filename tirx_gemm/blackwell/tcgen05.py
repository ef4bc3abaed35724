"""The tcgen05 engine: TMEM and its accumulator view, setup publication, MMA issue, commit, fences, TMEM reads."""

from __future__ import annotations

from tvm.script import tirx as T
from tvm.script.tirx import tile as Tx
from tvm.tirx.layout import S, TCol, TileLayout, TLane, tid_in_wg

from ..helpers import ACC_DTYPE

# --------------------------------------------------------------------------------------
# tensor memory, MMA issue, fences
# --------------------------------------------------------------------------------------
TMEM_COLS = 512  # the whole tensor memory of the SM: 128 lanes x 512 fp32 columns


def tmem_accumulator():
    """The fp32 accumulator view of tensor memory: lane = output row, column = output col.

    In TIRx 0.27 ``allocated_addr`` is a column offset from the CTA's TMEM base (TVM's own
    TMEMPool passes its running column offset), not the address tcgen05.alloc returns;
    passing ``tmem_addr[0]`` fails to compile ("variables (tmem_addr.source,) are used,
    but are not passed in as API arguments"). Offset 0 is the allocation's first column
    by construction: every step allocates all 512 columns, so an allocation succeeds only
    when the SM's whole TMEM is free and it always starts at column 0 (a second CTA on
    the SM blocks in tcgen05.alloc until the first one deallocates).
    """
    return T.decl_buffer((128, TMEM_COLS), ACC_DTYPE, scope="tmem", allocated_addr=0,
                         layout=TileLayout(S[(128, TMEM_COLS): (1 @ TLane, 1 @ TCol)]))


@T.inline
def tmem_alloc(tmem_addr):
    # warp-wide (.sync.aligned): all 32 lanes of one warp must execute it
    T.ptx["tcgen05.alloc.cta_group::1.sync.aligned.shared::cta.b32"](
        T.address_of(tmem_addr[0]), T.uint32(TMEM_COLS))


@T.inline
def tcgen05_cta_sync():
    # a CTA barrier that also orders tensor-core work: each thread's earlier tcgen05 ops
    # (MMA issue, TMEM loads) are ordered before it, and its later ones after it
    T.ptx["tcgen05.fence::before_thread_sync"]()
    T.cuda.cta_sync()
    T.ptx["tcgen05.fence::after_thread_sync"]()


@T.inline
def tmem_free(tmem_addr):
    # warp-wide, by the warp that allocated, after a tcgen05_cta_sync that every thread
    # reached once done with TMEM; releasing the permit lets the next CTA on this SM
    # allocate without waiting for this one to exit
    T.ptx["tcgen05.relinquish_alloc_permit.cta_group::1.sync.aligned"]()
    T.ptx["tcgen05.dealloc.cta_group::1.sync.aligned.b32"](tmem_addr[0], T.uint32(TMEM_COLS))


@T.inline
def publish_setup():
    # make barrier inits and the TMEM address slot visible to every thread and to the
    # async proxy (TMA, tensor cores) before anyone touches them; tcgen05.alloc is
    # tcgen05 work, so it is fenced before the barrier and every thread fences after it
    # before reading the allocated address or issuing tcgen05 work
    T.ptx.fence.proxy.async_.shared__cta()
    T.ptx["fence.mbarrier_init.release.cluster"]()
    tcgen05_cta_sync()


@T.inline
def publish_smem_writes():
    # thread stores (st.shared, the generic proxy) are not seen by tcgen05.mma (the async
    # proxy) through a CTA barrier alone: each writer fences its own stores into the
    # async proxy, then the barrier tells the MMA issuer that every writer has done so
    T.ptx.fence.proxy.async_.shared__cta()
    tcgen05_cta_sync()


@T.inline
def reclaim_smem():
    # the reverse direction: the MMA's async-proxy reads of SMEM, complete once this
    # thread's mbarrier wait returned, are ordered before its next ordinary stores there
    T.ptx.fence.proxy.async_.shared__cta()


@T.inline
def mma_commit(bar):
    # arrives on `bar` once every tcgen05.mma issued so far by this thread has completed
    T.ptx["tcgen05.commit.cta_group::1.mbarrier::arrive::one.shared::cluster.b64"](bar)


@T.inline
def mma_tile(tmem, Asmem, Bsmem, BLK_N, accum):
    # one elected thread issues the whole 128 x BLK_N x BLK_K tile; the hardware runs it
    Tx.gemm_async(tmem[:, :BLK_N], Asmem, Bsmem, accum=accum, dispatch="tcgen05",
                  cta_group=1)


@T.inline
def tmem_to_fp32(tmem, col, BLK_N, Dreg):
    # each thread of the warpgroup reads one accumulator row (TMEM lane = row) from
    # columns [col, col + BLK_N) into its fp32 registers Dreg (BLK_N of ACC_DTYPE) and
    # waits for the asynchronous tcgen05.ld
    Dreg_wg = Dreg.view(128, BLK_N, layout=TileLayout(S[(128, BLK_N): (1 @ tid_in_wg, 1)]))
    Tx.wg.copy_async(Dreg_wg[:, :], tmem[:, col:col + BLK_N])
    T.ptx["tcgen05.wait::ld.sync.aligned"]()


@T.inline
def tmem_to_registers(tmem, col, BLK_N, Dreg_out):
    # tmem_to_fp32, then narrowed to Dreg_out's dtype, the output dtype (fp16 or bf16)
    Dreg = T.alloc_local((BLK_N,), ACC_DTYPE)
    tmem_to_fp32(tmem, col, BLK_N, Dreg)
    Tx.cast(Dreg_out[:], Dreg[:])


@T.inline
def mma_tile_at(tmem, col, Asmem, Bsmem, BLK_N, accum):
    # as mma_tile, into accumulator columns [col, col + BLK_N)
    Tx.gemm_async(tmem[:, col:col + BLK_N], Asmem, Bsmem, accum=accum, dispatch="tcgen05",
                  cta_group=1)


@T.inline
def tcgen05_fence_after_sync():
    # order tcgen05 work after a thread synchronisation (mbarrier wait / bar.sync)
    T.ptx["tcgen05.fence::after_thread_sync"]()


@T.inline
def tcgen05_fence_before_sync():
    # order completed tcgen05 work (e.g. TMEM loads) before a thread synchronisation
    T.ptx["tcgen05.fence::before_thread_sync"]()
