"""Shared TIRx building blocks for every step (both arches).

The steps hold only their lesson; everything they share lives here: argument
validation, shared-memory layouts, barrier init, TMEM setup/teardown (sm_100a) and
the epilogues. This is also the one place that absorbs TIRx API churn: the
0.27.0.post1 spellings of PTX intrinsics are wrapped here once.

Python-level helpers (validation, layouts) run when a builder is called.
``@T.inline`` helpers are expanded into the kernel body at the call site, so the
generated CUDA is the same as if the code had been written inline.
"""

from __future__ import annotations

import tvm
from tvm.script import tirx as T
from tvm.script.tirx import tile as Tx
from tvm.tirx.layout import S, TCol, TileLayout, TLane, tid_in_wg
from tvm.backend.cuda.tile_primitive.tma_utils import SwizzleMode, mma_shared_layout

# D = A @ B.T: fp16 or bf16 operands, fp32 accumulation, output in the operands' dtype.
AB_DTYPE = "float16"   # the default operand dtype of every builder
ACC_DTYPE = "float32"
F16_BYTES = 2          # bytes per operand element: fp16 and bf16 are both 16-bit
SUPPORTED_DTYPES = ("float16", "bfloat16")
# TMA's rule for a global tensor: every stride but the innermost is a multiple of 16 bytes,
# so a row of A, B or D (K or N elements of 2 bytes) must be a multiple of 8 elements
TMA_ROW_MULTIPLE = 16 // F16_BYTES


# --------------------------------------------------------------------------------------
# argument validation: every builder calls these before it builds anything
# --------------------------------------------------------------------------------------
def check_dtype(dtype: str) -> None:
    if str(dtype) not in SUPPORTED_DTYPES:
        raise ValueError(
            f"dtype={dtype!r} is not supported: the steps take float16 or bfloat16 operands "
            f"(fp32 accumulate, output in the operands' dtype)"
        )


def check_positive_ints(**dims: int) -> None:
    for name, value in dims.items():
        if isinstance(value, bool) or not isinstance(value, int):
            raise ValueError(f"{name}={value!r} must be a Python int")
        if value <= 0:
            raise ValueError(f"{name}={value} must be positive")


def check_multiple(name: str, value: int, tile_name: str, tile: int) -> None:
    if value % tile != 0:
        raise ValueError(f"{name}={value} is not a multiple of {tile_name}={tile}")


def check_tiled_shape(M: int, N: int, K: int, BLK_M: int, BLK_N: int, BLK_K: int,
                      dtype: str = AB_DTYPE) -> None:
    """The common contract of all steps: positive ints, fp16, whole tiles only."""
    check_dtype(dtype)
    check_positive_ints(M=M, N=N, K=K)
    check_multiple("M", M, "BLK_M", BLK_M)
    check_multiple("N", N, "BLK_N", BLK_N)
    check_multiple("K", K, "BLK_K", BLK_K)


def ceil_div(a: int, b: int) -> int:
    return -(-a // b)


def check_edge_shape(M: int, N: int, K: int, dtype: str = AB_DTYPE) -> None:
    """The contract of the TMA steps (v4 on): any M >= 1, N and K multiples of 8.

    Tiles need not divide the problem: TMA loads zero-fill the part of a box that lies
    outside the tensor and TMA stores drop it, so edge tiles cost a full tile of work but
    no special code. What TMA cannot do is address a row whose byte stride is not a
    multiple of 16, hence N and K (the row lengths of D, A and B) in multiples of 8."""
    check_dtype(dtype)
    check_positive_ints(M=M, N=N, K=K)
    for name, value in (("N", N), ("K", K)):
        if value % TMA_ROW_MULTIPLE != 0:
            raise ValueError(
                f"{name}={value} is not a multiple of {TMA_ROW_MULTIPLE}: TMA needs every "
                f"row of A, B and D to start on a 16-byte boundary ({name} x 2 bytes)")


def check_equal(name: str, value: int, expected: int, why: str) -> None:
    if value != expected:
        raise ValueError(f"{name}={value} must equal {expected}: {why}")


# --------------------------------------------------------------------------------------
# layouts
# --------------------------------------------------------------------------------------
def swizzled_layout(shape, dtype: str = AB_DTYPE):
    """128B-swizzled K-major SMEM layout, consumable by both TMA and the tensor cores."""
    return mma_shared_layout(tvm.DataType(dtype), SwizzleMode.SWIZZLE_128B_ATOM, tuple(shape))


# --------------------------------------------------------------------------------------
# sm_100a (tcgen05): barriers, tensor memory, MMA issue, epilogues
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
def init_mbarrier(bar, count):
    T.ptx.mbarrier.init.shared.b64(bar, T.uint32(count))


# --------------------------------------------------------------------------------------
# mbarrier waits, optionally bounded by a watchdog (both arches)
# --------------------------------------------------------------------------------------
_watchdog_ns: int | None = None


def set_watchdog(ms: int | None) -> None:
    """Build every following kernel with bounded mbarrier waits: a wait that has not
    returned after ``ms`` milliseconds prints which barrier, stage, phase and role was
    waiting (and the block/thread) and traps, so a protocol bug becomes an error instead
    of a frozen GPU. None (the default) builds the plain, unbounded wait. The build
    harness calls this before the builder; it is part of the build's cache key."""
    global _watchdog_ns
    if ms is not None and (isinstance(ms, bool) or not isinstance(ms, int) or ms <= 0):
        raise ValueError(f"watchdog_ms={ms!r} must be a positive int (milliseconds) or None")
    _watchdog_ns = None if ms is None else ms * 1_000_000


def watchdog_ms() -> int | None:
    return None if _watchdog_ns is None else _watchdog_ns // 1_000_000


# try_wait in a loop, like TVM's own wait, plus a %globaltimer deadline; the strings name
# the barrier and the waiting role, `stage` is the ring slot (0 for a single barrier).
# No backslash escapes in this source: TVM unescapes them when it pastes it in (hence %c, 10).
_WATCHDOG_WAIT_SRC = """
__device__ __forceinline__ void tirx_gemm_watchdog_wait(void* bar, int phase,
    long long budget_ns, const char* name, int stage, const char* role) {
  unsigned int addr = (unsigned int)__cvta_generic_to_shared(bar);
  unsigned long long start, now;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(start));
  while (true) {
    unsigned int done;
    asm volatile("{ .reg .pred p; "
                 "mbarrier.try_wait.parity.acquire.cta.shared::cta.b64 p, [%1], %2; "
                 "selp.u32 %0, 1, 0, p; }"
                 : "=r"(done) : "r"(addr), "r"(phase) : "memory");
    if (done) return;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(now));
    if ((long long)(now - start) > budget_ns) {
      unsigned int active = __activemask();  // one line per waiting warp: its first lane
      if ((threadIdx.x & 31) == (unsigned int)(__ffs(active) - 1))
        printf("tirx-gemm watchdog: %s[%d] phase %d never completed: %s waited %lld ms "
               "(block %d, thread %d); trapping%c", name, stage, phase, role,
               budget_ns / 1000000, (int)blockIdx.x, (int)threadIdx.x, 10);
      asm volatile("trap;");
    }
  }
}
"""


def wait_mbarrier(bar, phase, name: str = "mbarrier", stage=0, role: str = "a thread"):
    """Wait until the phase of ``bar`` with parity ``phase`` has completed.

    ``name``, ``stage`` and ``role`` only matter in a watchdog build (set_watchdog): they
    are what the trap message names. A plain Python function, not ``@T.inline``: it
    chooses at build time between TVM's unbounded wait and the bounded one.
    """
    if _watchdog_ns is None:
        return T.cuda.mbarrier_wait(bar, phase)
    return T.cuda.func_call("tirx_gemm_watchdog_wait", bar, phase, T.int64(_watchdog_ns),
                            name, stage, role, source_code=_WATCHDOG_WAIT_SRC)


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


# TMA copies are "tma_explicit": one tensor map per global tensor with its true extents
# (M x K, N x K, M x N), a box of one 128-byte swizzle atom wide, so a box that reaches past
# the tensor's edge is legal: a load zero-fills the outside part (and still counts the whole
# box's bytes on the mbarrier), a store drops it. "tma_auto" would refuse any extent that
# is not a multiple of the swizzle atom (64 elements).
TMA = "tma_explicit"


@T.inline
def tma_load_tiles(Asmem, Bsmem, A, B, m_st, n_st, k_st, BLK_M, BLK_N, BLK_K, bar):
    # one thread (both arches): the arrival that tells `bar` how many bytes to expect,
    # then two TMA tile copies that complete on `bar`; the phase completes once this
    # thread has arrived and every byte has landed (zero-filled edge bytes count too)
    T.ptx.mbarrier.arrive.expect_tx.shared.b64(
        bar, T.uint32((BLK_M * BLK_K + BLK_N * BLK_K) * F16_BYTES))
    Tx.copy_async(Asmem, A[m_st:m_st + BLK_M, k_st:k_st + BLK_K], dispatch=TMA, mbar=bar)
    Tx.copy_async(Bsmem, B[n_st:n_st + BLK_N, k_st:k_st + BLK_K], dispatch=TMA, mbar=bar)


SWIZZLE_COLS = 64  # one 128-byte swizzle atom of 16-bit elements: the widest TMA box


@T.inline
def tma_store_swizzled(D, Dsmem, r0, m_st, n_st, ROWS, COLS):
    # one thread (both arches): TMA-store rows [r0, r0 + ROWS) of the swizzled staging
    # tile to D[m_st:, n_st:], one box per 64-column swizzle atom; rows and columns past
    # D's edge are not written. The caller fenced and synchronised the SMEM writers and
    # commits / waits on the bulk group.
    for h in T.unroll(COLS // SWIZZLE_COLS):
        Tx.copy_async(D[m_st:m_st + ROWS, n_st + h * SWIZZLE_COLS:n_st + (h + 1) * SWIZZLE_COLS],
                      Dsmem[r0:r0 + ROWS, h * SWIZZLE_COLS:(h + 1) * SWIZZLE_COLS],
                      dispatch=TMA)


@T.inline
def tmem_to_registers(tmem, col, BLK_N, Dreg_f16):
    # each thread of the warpgroup reads one accumulator row (TMEM lane = row) from
    # columns [col, col + BLK_N) as fp32, waits for the asynchronous tcgen05.ld, then
    # narrows to Dreg_f16's dtype, the 16-bit output dtype (fp16 or bf16; the "f16" in
    # the register names of the epilogues means 16-bit)
    Dreg = T.alloc_local((BLK_N,), ACC_DTYPE)
    Dreg_wg = Dreg.view(128, BLK_N, layout=TileLayout(S[(128, BLK_N): (1 @ tid_in_wg, 1)]))
    Tx.wg.copy_async(Dreg_wg[:, :], tmem[:, col:col + BLK_N])
    T.ptx["tcgen05.wait::ld.sync.aligned"]()
    Tx.cast(Dreg_f16[:], Dreg[:])


@T.inline
def epilogue_to_gmem(tmem, D, m_st, n_st, BLK_N, row, dtype):
    # TMEM -> registers -> GMEM: thread `row` of the warpgroup stores output row m_st + row
    # (`dtype`: D's dtype, what the fp32 accumulator is narrowed to)
    Dreg_f16 = T.alloc_local((BLK_N,), dtype)
    tmem_to_registers(tmem, 0, BLK_N, Dreg_f16)
    Tx.copy(D[m_st + row, n_st:n_st + BLK_N], Dreg_f16[:])


@T.inline
def store_tile_via_tma(Dreg_f16, Dsmem, D, m_st, n_st, BLK_M, BLK_N, row, is_leader, bar_id):
    # registers -> swizzled Dsmem -> (one thread) TMA store -> GMEM; `bar_id` names the
    # barrier that syncs the 128 threads of the storing warpgroup. Rows and columns of
    # the tile past D's edge are dropped by the TMA store (tma_store_swizzled).
    Tx.copy(Dsmem[row, 0:BLK_N], Dreg_f16[:])
    # generic-proxy SMEM writes must be fenced before the async proxy (TMA) reads them
    T.ptx.fence.proxy.async_.shared__cta()
    T.cuda.warpgroup_sync(bar_id)
    if is_leader:
        tma_store_swizzled(D, Dsmem, 0, m_st, n_st, BLK_M, BLK_N)
        T.ptx.cp.async_.bulk.commit_group()
        # Dsmem may be overwritten only after the store has read it
        T.ptx.cp.async_.bulk.wait_group(0)
    T.cuda.warpgroup_sync(bar_id)


@T.inline
def epilogue_to_tma_store(tmem, Dsmem, D, m_st, n_st, BLK_M, BLK_N, row, is_leader,
                          bar_id, dtype):
    # TMEM -> registers (narrowed to `dtype`, D's dtype) -> swizzled Dsmem -> (one
    # thread) TMA store -> GMEM
    Dreg_f16 = T.alloc_local((BLK_N,), dtype)
    tmem_to_registers(tmem, 0, BLK_N, Dreg_f16)
    store_tile_via_tma(Dreg_f16, Dsmem, D, m_st, n_st, BLK_M, BLK_N, row, is_leader, bar_id)


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

SMEM_BYTES_MAX = 227 * 1024  # opt-in dynamic shared memory per CTA on sm_90 / sm_100


def check_pipe_depth(PIPE_DEPTH: int, bytes_per_stage: int, other_bytes: int = 0) -> None:
    if isinstance(PIPE_DEPTH, bool) or not isinstance(PIPE_DEPTH, int) or PIPE_DEPTH < 1:
        raise ValueError(f"PIPE_DEPTH={PIPE_DEPTH!r} must be an int >= 1")
    need = PIPE_DEPTH * bytes_per_stage + other_bytes + 1024
    if need > SMEM_BYTES_MAX:
        raise ValueError(
            f"PIPE_DEPTH={PIPE_DEPTH} needs ~{need // 1024} KiB of shared memory, more than "
            f"the {SMEM_BYTES_MAX // 1024} KiB a CTA may use")


# Loop annotation that keeps a K-loop rolled (`#pragma unroll 1`): nvcc would otherwise
# unroll a 64-trip K-loop completely (256 MMA instructions, a 170 KB cubin, slow builds)
# and SASS counts would depend on the shape.
# The value is the boolean True (what TVM's own unroll=False emits); NumSim rejects 1.
ROLLED = {"disable_unroll": True}


# --- 2-CTA (cta_group::2) and multi-consumer helpers (v8, v9) ---
# A cluster of two CTAs (a "CTA pair") shares one tcgen05.mma: CTA 0 issues it with
# cta_group::2, the tensor cores read A and B from both CTAs' SMEM and write each CTA's
# 128 rows into that CTA's TMEM. Everything that owns pair-wide state (TMEM allocation,
# commits, barriers another CTA signals) uses the 2-CTA forms below.
CTA_PAIR = 2  # CTAs per cluster in v8 / v9


def check_even_sm_count(SM_COUNT: int) -> None:
    check_positive_ints(SM_COUNT=SM_COUNT)
    if SM_COUNT % CTA_PAIR != 0:
        raise ValueError(f"SM_COUNT={SM_COUNT} is not a multiple of the cluster size "
                         f"{CTA_PAIR}: the persistent pool is made of CTA pairs")


def barriers_in_cta(bars, depth, rank):
    """The barrier array ``bars`` as it lives in CTA ``rank`` of this cluster.

    Plain Python (called in the kernel body): mapa turns this CTA's address of ``bars``
    into the generic address of the same array in the peer's shared memory, which the
    2-CTA TMA (its completion barrier) and remote arrivals take.
    """
    mapped = T.alloc_local((1,), "uint64")
    T.evaluate(T.ptx.mapa.u64(mapped[0], bars.ptr_to([0]), T.uint32(rank)))
    ptr_type = tvm.ir.PointerType(tvm.ir.PrimType("uint64"), "shared")
    ptr = tvm.tirx.Var("peer_bars", ptr_type)
    T.Bind(T.reinterpret(ptr_type, mapped[0]), var=ptr)
    return T.decl_buffer((depth,), "uint64", data=ptr, scope="shared")


@T.inline
def arrive_remote(bar):
    # one arrival on a barrier in another CTA of the cluster (`bar` from barriers_in_cta)
    T.ptx.mbarrier.arrive.shared__cluster.b64(bar)


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
def publish_setup_pair():
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
def store_rows_via_tma(Dreg_f16, Dsmem, r0, D, m_st, n_st, BLK_M, EPI_N, row, is_leader,
                       bar_id):
    # store_tile_via_tma through rows [r0, r0 + BLK_M) of a taller staging buffer, so
    # that several epilogue warpgroups can share one Dsmem allocation (one band each)
    Tx.copy(Dsmem[r0 + row, 0:EPI_N], Dreg_f16[:])
    T.ptx.fence.proxy.async_.shared__cta()
    T.cuda.warpgroup_sync(bar_id)
    if is_leader:
        tma_store_swizzled(D, Dsmem, r0, m_st, n_st, BLK_M, EPI_N)
        T.ptx.cp.async_.bulk.commit_group()
        T.ptx.cp.async_.bulk.wait_group(0)
    T.cuda.warpgroup_sync(bar_id)
