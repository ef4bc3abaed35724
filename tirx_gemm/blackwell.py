"""Blackwell (sm_100a) building blocks: the tcgen05 engine, the twin of :mod:`tirx_gemm.hopper`.

On Blackwell one thread issues ``tcgen05.mma`` for the whole tile, the operands are read
from shared memory, and the fp32 accumulator lives in *tensor memory* (TMEM, 128 lanes x
512 columns per SM), allocated and freed by one warp. Completion is signalled by
``tcgen05.commit`` arriving on an mbarrier, and TMEM is read back with ``tcgen05.ld``.
The pieces every sm_100a step needs live here once: TMEM allocation, setup publication,
the MMA issue and commit verbs, the tcgen05 fences, the epilogues, and the 2-CTA
(``cta_group::2``) forms of v8 / v9. Steps import it as ``W``, next to
:mod:`tirx_gemm.helpers` (``H``: validation, layouts, barriers, TMA), exactly as the
sm_90a steps import :mod:`tirx_gemm.hopper`; a verb that exists on both arches has one
name in both modules (``W.publish_setup``, ``W.publish_smem_writes``, ``W.mma_commit``).

Everything that runs on the device is an ``@T.inline`` helper: it is expanded at the call
site, so the generated CUDA is the same as if the step had written it inline.
"""

from __future__ import annotations

from tvm.backend.cuda.lang import PipelineState
from tvm.backend.cuda.lang.clc import query_cancel_first_ctaid_x
from tvm.script import tirx as T
from tvm.script.tirx import tile as Tx
from tvm.tirx.layout import S, TCol, TileLayout, TLane, tid_in_wg

from . import helpers as H
from tirx_gemm import spec  # absolute: a hookless copy of this file reads the package's
from .helpers import ACC_DTYPE, TMA, check_positive_ints, tma_store_swizzled

# --------------------------------------------------------------------------------------
# tensor memory, MMA issue, fences, epilogues
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
def tmem_to_registers(tmem, col, BLK_N, Dreg_out):
    # each thread of the warpgroup reads one accumulator row (TMEM lane = row) from
    # columns [col, col + BLK_N) as fp32, waits for the asynchronous tcgen05.ld, then
    # narrows to Dreg_out's dtype, the output dtype (fp16 or bf16)
    Dreg = T.alloc_local((BLK_N,), ACC_DTYPE)
    Dreg_wg = Dreg.view(128, BLK_N, layout=TileLayout(S[(128, BLK_N): (1 @ tid_in_wg, 1)]))
    Tx.wg.copy_async(Dreg_wg[:, :], tmem[:, col:col + BLK_N])
    T.ptx["tcgen05.wait::ld.sync.aligned"]()
    Tx.cast(Dreg_out[:], Dreg[:])


@T.inline
def epilogue_to_gmem(tmem, D, m_st, n_st, BLK_N, row, dtype):
    # TMEM -> registers -> GMEM: thread `row` of the warpgroup stores output row m_st + row
    # (`dtype`: D's dtype, what the fp32 accumulator is narrowed to)
    Dreg_out = T.alloc_local((BLK_N,), dtype)
    tmem_to_registers(tmem, 0, BLK_N, Dreg_out)
    Tx.copy(D[m_st + row, n_st:n_st + BLK_N], Dreg_out[:])


@T.inline
def store_tile_via_tma(Dreg_out, Dsmem, D, m_st, n_st, BLK_M, BLK_N, row, bar_id):
    # registers -> swizzled Dsmem -> TMA store -> GMEM; `row` is the thread's index in the
    # storing warpgroup and `bar_id` names the barrier that syncs its 128 threads. The
    # store is issued as every async copy is: by the lane `elect_sync` picks in one warp
    # (here the warpgroup's first). Rows and columns of the tile past D's edge are dropped
    # by the TMA store (tma_store_swizzled).
    Tx.copy(Dsmem[row, 0:BLK_N], Dreg_out[:])
    # generic-proxy SMEM writes must be fenced before the async proxy (TMA) reads them
    T.ptx.fence.proxy.async_.shared__cta()
    T.cuda.warpgroup_sync(bar_id)
    if row < 32:
        if T.cuda.elect_sync():
            tma_store_swizzled(D, Dsmem, 0, m_st, n_st, BLK_M, BLK_N)
            T.ptx.cp.async_.bulk.commit_group()
            # Dsmem may be overwritten only after the store has read it
            T.ptx.cp.async_.bulk.wait_group(0)
    T.cuda.warpgroup_sync(bar_id)


@T.inline
def epilogue_to_tma_store(tmem, Dsmem, D, m_st, n_st, BLK_M, BLK_N, row, bar_id, dtype):
    # TMEM -> registers (narrowed to `dtype`, D's dtype) -> swizzled Dsmem -> (one
    # thread) TMA store -> GMEM
    Dreg_out = T.alloc_local((BLK_N,), dtype)
    tmem_to_registers(tmem, 0, BLK_N, Dreg_out)
    store_tile_via_tma(Dreg_out, Dsmem, D, m_st, n_st, BLK_M, BLK_N, row, bar_id)


@T.inline
def store_row_guarded(Dreg_out, D, m, n0, COLS, M, N):
    # one thread stores its row's COLS values (a multiple of 8) straight from registers to
    # D[m, n0:n0 + COLS] in 8-column (16-byte) pieces, skipping a row past M and pieces
    # past N (N is a multiple of 8, so a piece is wholly inside D or wholly outside)
    if m < M:
        for j in T.unroll(COLS // 8):
            if n0 + j * 8 < N:
                Tx.copy(D[m, n0 + j * 8:n0 + j * 8 + 8], Dreg_out[j * 8:j * 8 + 8])


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
# --- 2-CTA (cta_group::2) and multi-consumer helpers (v8, v9) ---
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


@T.inline
def store_rows_via_tma(Dreg_out, Dsmem, r0, D, m_st, n_st, BLK_M, EPI_N, row, bar_id):
    # store_tile_via_tma through rows [r0, r0 + BLK_M) of a taller staging buffer, so
    # that several epilogue warpgroups can share one Dsmem allocation (one band each)
    Tx.copy(Dsmem[r0 + row, 0:EPI_N], Dreg_out[:])
    T.ptx.fence.proxy.async_.shared__cta()
    T.cuda.warpgroup_sync(bar_id)
    if row < 32:
        if T.cuda.elect_sync():
            tma_store_swizzled(D, Dsmem, r0, m_st, n_st, BLK_M, EPI_N)
            T.ptx.cp.async_.bulk.commit_group()
            T.ptx.cp.async_.bulk.wait_group(0)
    T.cuda.warpgroup_sync(bar_id)


# --- v10: Cluster Launch Control (CLC), the dynamic tile scheduler ---
CLC_NO_TILE = 0xFFFFFFFF  # the decoded response of a request that cancelled nothing
CLC_RESPONSE_BYTES = 16   # try_cancel's opaque response (one b128)


@T.inline
def clc_try_cancel(response, bar):
    # one thread: ask the hardware to cancel one cluster of this launch that has not started
    # yet. The 16-byte response (that cluster's first CTA id, or "nothing left") is written
    # to `response` in every CTA of this cluster (.multicast::cluster::all) and completes 16
    # bytes of transaction on `bar` at the same SMEM offset in each of them
    T.ptx.clusterlaunchcontrol.try_cancel.async_.shared__cta.mbarrier__complete_tx__bytes.multicast__cluster__all.b128(
        T.address_of(response[0]), bar)


@T.meta_class
class ClusterLaunchControl:
    """v10's tile scheduler: a CTA pair that finishes a tile asks the hardware for the tile
    of a cluster that has not started yet. Owns the 16-byte response slot and its two
    barriers, and each thread's view of the rounds::

        clc = W.ClusterLaunchControl(pool, READERS, enabled=CLC)  # clc_full, clc_empty, slot
        clc.init()               # the init thread, before the setup cluster barrier
        clc.connect()            # every thread, after it: CTA 0's clc_empty (mapa)
        # CTA 0's scheduler warp, per round: request -> wait_response -> decode -> advance
        #   -> (cancelled: arm the next round) -> release
        # every other reader, at the end of its tile: next_tile(scheduler, role, TILES)

    Contract: ``clc_full`` (one per CTA) completes on 1 arrival (``arm``: its CTA's
    expect_tx of 16 bytes; round 0 by ``init``, round r + 1 by the scheduler warp after
    reading r) plus the response's 16 bytes. ``clc_empty`` (CTA 0's copy counts) completes
    on ``readers`` arrivals, one per reader of both CTAs once it decoded the round; CTA 0's
    ``request`` waits for it (parity 1 first: the slot starts free). With ``enabled`` False
    (v10's CLC=False) the SMEM is still allocated but never initialised, and ``next_tile``
    is the tile scheduler's own fixed stride."""

    FULL, EMPTY = "clc_full", "clc_empty"  # the barriers' names (watchdog, lesson table)
    FULL_COUNT = 1  # clc_full's arrivals per round: its CTA's expect_tx (arm)

    def __init__(self, pool, readers: int, enabled: bool = True):
        self.full = H.Barriers(pool, 1, self.FULL)
        self.empty = H.Barriers(pool, 1, self.EMPTY)
        self.response = pool.alloc((4,), "uint32", align=16)
        self.readers = readers
        self.enabled = enabled
        self.nxt = T.local_scalar("uint32")  # the decoded response: first CTA id or NO_TILE
        self.rounds = PipelineState(1, 0)  # clc_full's phase: one round per finished tile
        self.free = PipelineState(1, 1)    # clc_empty's phase, as CTA 0's scheduler waits it
        self.empty_cta0 = None

    @T.inline
    def init(self):
        # the init thread of each CTA, before the setup cluster barrier: both barriers, and
        # round 0 armed before CTA 0 can request it
        if self.enabled:
            self.full.init(self.FULL_COUNT)
            self.empty.init(self.readers)
            self.arm()

    def connect(self):
        """CTA 0's clc_empty as this CTA addresses it (mapa), where every reader of both
        CTAs releases a round: call once in the kernel body, after the setup barrier."""
        self.empty_cta0 = self.empty.in_cta(0)

    @T.inline
    def arm(self):
        # one thread per CTA: this CTA's arrival on clc_full, expecting the response's bytes
        self.full.arrive_expect_tx(0, CLC_RESPONSE_BYTES)

    @T.inline
    def request(self, role):
        # CTA 0's scheduler warp: once every reader released the last response, one thread
        # asks for the next tile
        self.empty.wait(0, self.free.phase, role)
        self.free.advance()
        if T.cuda.elect_sync():
            clc_try_cancel(self.response, self.full.ptr(0))

    @T.inline
    def wait_response(self, role):
        # every reader: this round's response has landed in this CTA's slot
        self.full.wait(0, self.rounds.phase, role)

    @T.inline
    def decode(self):
        # every reader: the response -> nxt (the cancelled cluster's first CTA id x, or
        # CLC_NO_TILE), with the fence that lets the next try_cancel rewrite the slot
        query_cancel_first_ctaid_x(self.nxt, T.address_of(self.response[0]))

    def cancelled(self):
        """The decoded response names a tile (False: nothing left to cancel)."""
        return self.nxt != T.uint32(CLC_NO_TILE)

    def tile(self):
        """The decoded response's tile: one cluster per tile, two CTAs per cluster."""
        return T.Cast("int32", self.nxt // T.uint32(CTA_PAIR))

    @T.inline
    def advance(self):
        # the next round's clc_full parity
        self.rounds.advance()

    @T.inline
    def release(self):
        # every reader, once it decoded the round: one arrival on CTA 0's clc_empty
        self.empty_cta0.arrive_remote(0)

    @T.inline
    def next_tile(self, scheduler, role, TILES):
        # every reader except the scheduler warp, at the end of its tile: read the round,
        # release the slot, move `scheduler` to the response's tile (past the last tile,
        # scheduler.valid() is False). Disabled: the scheduler's own fixed stride
        if self.enabled:
            self.wait_response(role)
            self.decode()
            self.release()
            self.advance()
            if self.nxt == T.uint32(CLC_NO_TILE):
                scheduler.init(TILES)
            else:
                scheduler.init(self.tile())
        else:
            scheduler.next_tile()


# --- the fused epilogue (issue 28): bias, activation, SwiGLU, fp32 output ---
# The keywords and their numpy references live in tirx_gemm.epilogue (one home for both
# arches); these verbs are where the tile sits when each operation runs on sm_100a:
# TMEM --tcgen05.ld--> fp32 registers (one output row per thread) --bias, activation or
# silu(gate)*up, in fp32--> cast to D's dtype --> swizzled Dsmem --TMA store--> GMEM.
EPI_ROW_BYTES = 128  # a staged chunk row is one 128-byte swizzle atom (TMA's widest box)


TMEM_READ_N = 64  # accumulator columns per tcgen05.ld in the fused epilogue


def epilogue_chunks(out_dtype: str, swiglu: bool) -> tuple[int, int, int]:
    """(OUT_N, OUT_STEP, READS): a step of the fused epilogue reads READS x TMEM_READ_N
    accumulator columns (64 per tcgen05.ld, as the plain epilogue) into OUT_STEP outputs
    (SwiGLU: two columns per output), staged and stored in chunks of OUT_N columns, one
    128-byte swizzle atom per row (64 16-bit or 32 fp32 values).
    Why never narrower loads: ptxas sizes the kernel's entry register count by the code's
    demand, and a 32-column epilogue needed only ~44 at 384 threads, less than the 168
    the 56/224 setmaxnreg split needs, so the epilogue's setmaxnreg.inc could never be
    granted (the build refuses it: compile/regbudget.py; NumSim does not model it)."""
    out_bytes = 4 if out_dtype == "float32" else 2
    OUT_N = EPI_ROW_BYTES // out_bytes
    per_read = TMEM_READ_N // 2 if swiglu else TMEM_READ_N
    READS = max(1, OUT_N // per_read)
    return OUT_N, READS * per_read, READS


# erfc(z) for z >= 0 as t * exp(-z^2 + P(t)), t = 1 / (1 + z/2): the Chebyshev fit of
# Numerical Recipes' erfcc (Press et al., 2nd ed., section 6.2), fractional error below
# 1.2e-7 for every z >= 0 (a relative bound, so the tail Phi(x) of a negative x keeps it)
_ERFC_P = (-1.26551223, 1.00002368, 0.37409196, 0.09678418, -0.18628806, 0.27886807,
           -1.13520398, 1.48851587, -0.82215223, 0.17087277)


def _erfc_nonneg(z):
    t = T.float32(1.0) / (T.float32(1.0) + T.float32(0.5) * z)
    p = T.float32(_ERFC_P[-1])
    for c in reversed(_ERFC_P[:-1]):
        p = T.float32(c) + t * p
    return t * T.exp(p - z * z)


def activation(x, act):
    """act(x) as a TIR expression of the fp32 value x (the functions torch computes:
    tirx_gemm.epilogue.act_np), written with exp, division and compares only: NumSim
    models tirx.exp but has no erf or tanh (the precise erff / tanhf), and exp is
    what the GPU evaluates fastest.
      gelu:      x * Phi(x), Phi(x) = 1 - erfc(x/sqrt2)/2 (x >= 0) or erfc(-x/sqrt2)/2,
                 erfc to 1.2e-7 relative (above);
      gelu_tanh: 0.5 x (1 + tanh(y)) = x * sigmoid(2y) = x / (1 + exp(-2y)),
                 y = sqrt(2/pi) (x + 0.044715 x^3): the same function, no tanh;
      silu:      x / (1 + exp(-x)).
    nvcc builds with --use_fast_math, so exp is __expf and / the approximate division:
    a few ulp of fp32 for moderate |x| (the 2-byte outputs round off far more)."""
    if act is None:
        return x
    if act == "relu":
        return T.max(x, T.float32(0.0))
    if act == "gelu":
        e = _erfc_nonneg(T.abs(x) * T.float32(0.7071067811865476))
        half_e = T.float32(0.5) * e
        return x * T.if_then_else(x >= T.float32(0.0), T.float32(1.0) - half_e, half_e)
    if act == "gelu_tanh":
        y2 = T.float32(1.5957691216057308) * (x + T.float32(0.044715) * x * x * x)
        return x / (T.float32(1.0) + T.exp(T.float32(0.0) - y2))
    if act == "silu":
        return x / (T.float32(1.0) + T.exp(T.float32(0.0) - x))
    raise ValueError(f"ACT={act!r} must be None or relu, gelu, gelu_tanh, silu")


def fused_epilogue_chunk(act, bias_dtype, swiglu: bool, group: int, READS: int,
                         out_dtype: str):
    """The @T.inline verb that fills one step's registers (``Dout``: OUT_STEP values of
    ``out_dtype``) of this thread's output row from accumulator columns [col, col +
    READS * READ_N): per TMEM load, READ_N = TMEM_READ_N fp32 values; then, in fp32, either
    act(acc + bias[n]) (``bias_dtype`` False: no bias) or, with ``swiglu``, the pairs of
    ``group`` gate columns followed by ``group`` up columns -> silu(gate) * up; then one
    rounding to ``out_dtype``. ``n_out`` is the step's first output column; bias columns
    past N read bias[N - 1] (their outputs lie past D's edge, the TMA store drops them)."""
    READ_N = TMEM_READ_N
    OUT_PER_READ = READ_N // 2 if swiglu else READ_N
    HAS_BIAS = bool(bias_dtype)

    @T.inline
    def fill(tmem, col, Dout, bias, n_out, N):
        for r in T.unroll(READS):
            acc = T.alloc_local((READ_N,), ACC_DTYPE)
            acc_wg = acc.view(128, READ_N, layout=TileLayout(S[(128, READ_N): (1 @ tid_in_wg, 1)]))
            Tx.wg.copy_async(acc_wg[:, :], tmem[:, col + r * READ_N:col + (r + 1) * READ_N])
            T.ptx["tcgen05.wait::ld.sync.aligned"]()
            if swiglu:
                # accumulator columns 2*group*t + [0, group) are gate, + [group, 2*group)
                # up, of outputs group*t + [0, group): a thread holds both of each pair
                for j in T.unroll(OUT_PER_READ):
                    g = T.meta_var(acc[(j // group) * 2 * group + j % group])
                    u = T.meta_var(acc[(j // group) * 2 * group + group + j % group])
                    Dout[r * OUT_PER_READ + j] = T.cast(activation(g, "silu") * u, out_dtype)
            elif HAS_BIAS:
                for j in T.unroll(READ_N):
                    b = T.meta_var(bias[T.min(n_out + r * READ_N + j, N - 1)])
                    Dout[r * READ_N + j] = T.cast(
                        activation(acc[j] + T.cast(b, ACC_DTYPE), act), out_dtype)
            else:
                for j in T.unroll(READ_N):
                    Dout[r * READ_N + j] = T.cast(activation(acc[j], act), out_dtype)

    return fill


@T.inline
def store_rows_box_via_tma(Dout, d0, Dsmem, r0, D, m_st, n_st, BLK_M, OUT_N, row, bar_id):
    # store_rows_via_tma for a chunk of any dtype, Dout[d0:d0 + OUT_N]: OUT_N columns are
    # one 128-byte swizzle atom per row (64 16-bit or 32 fp32 values), stored as one TMA
    # box; rows and columns past D's edge are dropped by the store
    Tx.copy(Dsmem[r0 + row, 0:OUT_N], Dout[d0:d0 + OUT_N])
    T.ptx.fence.proxy.async_.shared__cta()
    T.cuda.warpgroup_sync(bar_id)
    if row < 32:
        if T.cuda.elect_sync():
            Tx.copy_async(D[m_st:m_st + BLK_M, n_st:n_st + OUT_N],
                          Dsmem[r0:r0 + BLK_M, 0:OUT_N], dispatch=TMA)
            T.ptx.cp.async_.bulk.commit_group()
            T.ptx.cp.async_.bulk.wait_group(0)
    T.cuda.warpgroup_sync(bar_id)


def without_operand(func, name: str):
    """``func`` with its parameter ``name`` removed, refused (ValueError) if the body reads
    or writes that buffer: how one builder source serves the operand lists with and without
    an optional operand (v9's ``bias``) and still compiles the plain kernel unchanged."""
    from tvm import tirx
    import tvm.tirx.analysis  # noqa: F401
    params = list(func.params)
    var = next((p for p in params if p.name == name), None)
    if var is None:
        raise ValueError(f"the kernel has no operand {name!r}")
    handles = (var, getattr(var, "data", var))
    used = [v for v in tirx.analysis.undefined_vars(func.body)
            if any(v.same_as(h) for h in handles)]
    if used:
        raise ValueError(f"operand {name!r} is used by the kernel body: it cannot be dropped")
    return tirx.PrimFunc([p for p in params if not p.same_as(var)], func.body, func.ret_type,
                         func.attrs)


# --- v13: fp8 (e4m3) operands, tcgen05.mma kind::f8f6f4 ---
# One byte per element, so a 128-byte swizzle row (the TMA box's and the SMEM
# descriptor's unit) holds 128 elements of K: a stage is BLK_K = 128 of e4m3 where it was
# 64 of fp16, with the same bytes. The kernel's operands and SMEM hold the e4m3 bits as
# uint8 (TMA copies bytes); the MMA reads the same SMEM through a float8_e4m3fn view, which
# is what makes Tx.gemm_async emit kind::f8f6f4 (K = 32 per instruction, 4 per stage) and
# encode e4m3 into the instruction descriptor. The accumulator in TMEM is fp32.
FP8_BLK_K = 128                 # e4m3 elements in one 128-byte swizzle row
FP8_STORAGE = "uint8"           # how the kernel's signature and SMEM hold e4m3 bits
FP8_MMA_DTYPE = "float8_e4m3fn"  # what the tensor core is told the bytes are
FP8_OUT_DTYPES = spec.DTYPES  # v13's out dtypes: the 16-bit ones
FP8_SCALES = ("tensor", "row")  # sm_100a v13's scale modes (epilogue); no "block" yet


def fp8_scaled_chunk(row_scaled: bool, READ_N: int, out_dtype: str):
    """The @T.inline verb that fills one staged chunk (``Dout``: READ_N values of
    ``out_dtype``) of this thread's output row ``m`` from accumulator columns [col, col +
    READ_N): one tcgen05.ld of fp32 values, the scale applied in fp32, one rounding.
    "tensor" (``row_scaled`` False): acc * (SA[0] * SB[0]); "row": acc * SA[m] * SB[n]:
    each lane loads the chunk's SB values of columns n0 + lane + 32h (h < READ_N / 32:
    coalesced, two registers) and column j's value reaches every lane by a warp shuffle
    (64 loads or 64 factors per thread would not fit the 168 registers ptxas has for the
    whole kernel at 384 threads; setmaxnreg does not raise that bound). Rows past M read
    SA[M - 1], columns past N read SB[N - 1]: their outputs lie past D's edge and the TMA
    store drops them."""
    HALVES = READ_N // 32

    @T.inline
    def fill(tmem, col, Dout, SA, SB, m, n0, M, N, lane):
        f = T.alloc_local((1,), ACC_DTYPE)
        sb = T.alloc_local((HALVES,), ACC_DTYPE)
        if row_scaled:
            f[0] = SA[T.min(m, M - 1)]
            for h in T.unroll(HALVES):
                sb[h] = SB[T.min(n0 + h * 32 + lane, N - 1)]
        else:
            f[0] = SA[0] * SB[0]
        acc = T.alloc_local((READ_N,), ACC_DTYPE)
        acc_wg = acc.view(128, READ_N, layout=TileLayout(S[(128, READ_N): (1 @ tid_in_wg, 1)]))
        Tx.wg.copy_async(acc_wg[:, :], tmem[:, col:col + READ_N])
        T.ptx["tcgen05.wait::ld.sync.aligned"]()
        for j in T.unroll(READ_N):
            if row_scaled:
                Dout[j] = T.cast(acc[j] * f[0] * T.cuda.__shfl_sync(
                    T.uint32(0xFFFFFFFF), sb[j // 32], j % 32, 32), out_dtype)
            else:
                Dout[j] = T.cast(acc[j] * f[0], out_dtype)

    return fill


# --- v13 SCALE="mx": block-scaled MXFP8, tcgen05.mma kind::mxf8f6f4.block_scale ---
# One UE8M0 (e8m0: 2**(e - 127)) scale factor per 32 elements of K, per row of A and of B,
# applied by the tensor core inside the MMA (scale_vec::1X: one SF per K = 32 MMA).
# The MMA reads the SFs from TMEM, so each stage's SFs travel GMEM -TMA-> SMEM
# -tcgen05.cp-> TMEM. Their SMEM (and GMEM) order is the hardware's 128 x 4 atom: for
# 128 rows (r = 32 i + l, i < 4, l < 32) and 4 SFs of K (j < 4, one stage of 128 e4m3),
# byte l * 16 + i * 4 + j, 512 bytes; tcgen05.cp 32x128b.warpx4 copies lane l's 16 bytes
# into all four 32-lane quarters of TMEM, and the MMA takes quarter i's SFs from byte i.
MX_SF_VEC = 32                    # e4m3 elements of K per scale factor
MX_SF_STORAGE = "uint8"           # how GMEM and SMEM hold the e8m0 bytes (TMA copies bytes)
MX_SF_DTYPE = "float8_e8m0fnu"    # what tcgen05.cp / the MMA are told the bytes are
MX_SF_ROWS = 128                  # rows per SF atom
MX_SF_K = FP8_BLK_K // MX_SF_VEC  # 4 SFs of K per row per stage
MX_SF_ATOM_BYTES = MX_SF_ROWS * MX_SF_K  # 512
MX_SF_BOX = (MX_SF_ATOM_BYTES // 128, 128)  # an atom as a (4, 128) TMA box of bytes


def mx_sf_gmem_shape(rows: int, K: int) -> tuple[int, int]:
    """The kernel's SFA (rows = M) or SFB (rows = N) operand: the blocked atoms of
    numerics.mx_block_sf_np, atom (row block rb, K stage kb) at box rows 4 (rb * KB + kb)."""
    rb = -(-rows // MX_SF_ROWS)
    kb = -(-K // FP8_BLK_K)
    return (rb * kb * MX_SF_BOX[0], MX_SF_BOX[1])


def mx_sf_layouts(pipe_depth: int):
    """(SMEM layout of a (pipe_depth, 128, 4) e8m0 view of the staged atoms, TMEM layout
    of a (pipe_depth, 128, 4) SF ring): TVM's tcgen05 block-scaled layouts for one SF per
    MMA (sf_per_mma=1, mxf8f6f4 with K = 32)."""
    from tvm.backend.cuda.tile_primitive.gemm_async.tcgen05 import sf_smem_layout, sf_tmem_layout
    return (sf_smem_layout(MX_SF_ROWS, MX_SF_K, 1, pipe_depth=pipe_depth),
            sf_tmem_layout(MX_SF_ROWS, MX_SF_K, 1, pipe_depth=pipe_depth))


def mx_sf_tmem(col: int, pipe_depth: int):
    """A (pipe_depth, 128, 4) e8m0 SF ring in TMEM from 32-bit column ``col`` (4 columns
    per stage: 128 rows x 4 SFs, 32 lanes x 4 bytes per column, replicated per quarter)."""
    return T.decl_buffer((pipe_depth, MX_SF_ROWS, MX_SF_K), MX_SF_DTYPE, scope="tmem",
                         allocated_addr=col, layout=mx_sf_layouts(pipe_depth)[1])


@T.inline
def mx_sf_to_tmem(sf_tmem, sf_smem):
    # one thread: tcgen05.cp of one stage's 128 x 4 SFs, SMEM -> TMEM (asynchronous; a
    # later tcgen05.mma of the same thread sees it, and tcgen05.commit tracks it)
    Tx.copy_async(sf_tmem, sf_smem)


@T.inline
def mma_tile_mx(tmem, col, Asmem, Bsmem, SFA, SFB, BLK_N, accum):
    # as mma_tile_at, block-scaled: kind::mxf8f6f4.block_scale with UE8M0 SFs from TMEM
    Tx.gemm_async(tmem[:, col:col + BLK_N], Asmem, Bsmem, SFA, SFB, accum=accum,
                  dispatch="tcgen05", cta_group=1)
