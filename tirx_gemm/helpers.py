"""Shared TIRx building blocks for every step (both arches).

The steps hold only their lesson; everything both tracks share lives here: argument
validation, shared-memory layouts, named barrier arrays (:class:`Barriers`) with their
waits (optionally bounded by a watchdog), the TMA loads and stores, and the SMEM fences
and bulk-group verbs around them. The MMA engine of each arch has its own module with
the same verbs: :mod:`tirx_gemm.blackwell` (tcgen05, TMEM) and :mod:`tirx_gemm.hopper`
(wgmma, register accumulators). Steps import ``helpers as H`` and their engine as ``W``.
This is also the one place that absorbs TIRx API churn: the 0.27.0.post1 spellings of
PTX intrinsics are wrapped here once.

Python-level helpers (validation, layouts) run when a builder is called.
``@T.inline`` helpers are expanded into the kernel body at the call site, so the
generated CUDA is the same as if the code had been written inline.
"""

from __future__ import annotations

import tvm
from tvm.script import tirx as T
from tvm.script.tirx import tile as Tx
from tvm.backend.cuda.tile_primitive.tma_utils import SwizzleMode, mma_shared_layout

# the timeline event hooks: None (nothing emitted) unless TIMELINE=True. Imported by its
# absolute name: mutants.py loads an edited copy of this file as a top-level module
from tirx_gemm import spec
from tirx_gemm import timeline as TL

# D = A @ B.T: fp16 or bf16 operands, fp32 accumulation, output in the operands' dtype.
AB_DTYPE = spec.DEFAULT_DTYPE   # the default operand dtype of every builder
ACC_DTYPE = "float32"
SUPPORTED_DTYPES = spec.DTYPES
# bytes per element of A, B and D: every dtype in spec.DTYPES (fp16, bf16) is 16-bit
ELEM_BYTES = spec.element_bytes(AB_DTYPE)
assert all(spec.element_bytes(d) == ELEM_BYTES for d in SUPPORTED_DTYPES)
# TMA's rule for a global tensor: every stride but the innermost is a multiple of 16 bytes,
# so a row of A, B or D (K or N elements of 2 bytes) must be a multiple of 8 elements
TMA_ROW_MULTIPLE = spec.row_multiple(spec.DEFAULT_DTYPE)


# --------------------------------------------------------------------------------------
# argument validation: every builder calls these before it builds anything
# --------------------------------------------------------------------------------------
def check_dtype(dtype: str) -> None:
    if str(dtype) not in SUPPORTED_DTYPES:
        raise ValueError(
            f"dtype={dtype!r} is not supported: the steps take float16 or bfloat16 operands "
            f"(fp32 accumulate, output in the operands' dtype)"
        )


def check_fp8_contract(M, N, K, dtype) -> str:
    """v13's shape and dtype contract, one text for both arches: e4m3 A (M x K) and B (N x
    K) as uint8 bytes, D (M x N) in ``dtype`` (float16 or bfloat16; the operands are always
    e4m3). Returns the dtype as a str."""
    if str(dtype) not in SUPPORTED_DTYPES:
        raise ValueError(f"dtype={dtype!r} is not supported as v13's output dtype: choose "
                         f"float16 or bfloat16 (the operands are always e4m3)")
    check_positive_ints(M=M, N=N, K=K)
    n_mult, k_mult = spec.row_multiple(str(dtype)), spec.row_multiple("float8_e4m3fn")
    if N % n_mult:
        raise ValueError(f"N={N} is not a multiple of {n_mult}: TMA needs every row of D to "
                         f"start on a 16-byte boundary (N x 2 bytes)")
    if K % k_mult:
        raise ValueError(f"K={K} is not a multiple of {k_mult}: TMA needs every row of A and "
                         f"B to start on a 16-byte boundary (K x 1 byte)")
    return str(dtype)


def check_positive_ints(**dims: int) -> None:
    for name, value in dims.items():
        if isinstance(value, bool) or not isinstance(value, int):
            raise ValueError(f"{name}={value!r} must be a Python int")
        if value <= 0:
            raise ValueError(f"{name}={value} must be positive")


def runtime_rows(M: int, RUNTIME_M: bool):
    """M as the kernel body sees it: the int the build was asked for, or, with
    ``RUNTIME_M=True``, a run-time variable (``tvm.tirx.Var("M")``). TVM's host code then
    binds M from ``A.shape[0]`` at every call and makes the TMA descriptors for that M, so
    one compiled kernel serves every M >= 1; every use of M in the body (tile counts, edge
    tests) becomes an expression evaluated on the GPU. ``M`` is still checked first: it is
    the shape the build is recorded at."""
    if not isinstance(RUNTIME_M, bool):
        raise ValueError(f"RUNTIME_M={RUNTIME_M!r} must be True or False")
    return runtime_extent("M") if RUNTIME_M else M


def runtime_extent(name: str):
    """A run-time extent of an operand (an int32 variable the host code binds from the
    tensor's shape): M, or a workspace's length that only has to be large enough."""
    return tvm.tirx.Var(name, "int32")


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


# --------------------------------------------------------------------------------------
# named barrier arrays (both arches)
# --------------------------------------------------------------------------------------
@T.meta_class
class Barriers:
    """``depth`` mbarriers in shared memory that carry their name (one per ring stage, or
    ``depth=1`` for a single barrier). Allocated from ``pool`` exactly as
    ``pool.alloc((depth,), "uint64", align=8)`` would, so the SMEM layout is that of a
    plain array; the name is what a watchdog build prints when a wait on it never returns.

    In a kernel::

        tma2mma = H.Barriers(pool, PIPE_DEPTH, "tma2mma")
        tma2mma.init(1)                    # one thread: every stage completes on 1 arrival
        tma2mma.wait(ring.stage, ring.phase, "MMA issuer")   # one line, watchdog-labelled
        tma2mma.arrive(stage)              # one plain arrival of this thread
        tma2mma.ptr(stage)                 # the address, for TMA copies and MMA commits
    """

    def __init__(self, pool, depth: int, name: str, buf=None):
        self.buf = pool.alloc((depth,), "uint64", align=8) if buf is None else buf
        self.depth = depth
        self.name = name

    def ptr(self, stage=0):
        """The shared address of barrier ``stage`` (what TMA copies and commits take)."""
        return self.buf.ptr_to([stage])

    @T.inline
    def init(self, count):
        # one thread: mbarrier.init of every stage, each completing a phase after `count`
        # arrivals; then every thread publishes the inits (W.publish_setup)
        for s in T.unroll(self.depth):
            T.ptx.mbarrier.init.shared.b64(self.buf.ptr_to([s]), T.uint32(count))

    def wait(self, stage, phase, role: str):
        """Wait until the phase of barrier ``stage`` with parity ``phase`` has completed;
        ``role`` names the waiter in a watchdog build's trap message (and, in a TIMELINE
        build, the span: a "producer" waits for a free stage, anyone else for data)."""
        return TL.around(wait_mbarrier(self.buf.ptr_to([stage]), phase, self.name, stage, role),
                         TL.EMPTY_WAIT if role == "producer" else TL.FULL_WAIT, stage,
                         TL.PRODUCER if role == "producer" else TL.BY_WARPGROUP)

    @T.inline
    def arrive(self, stage):
        # one arrival of this thread on barrier `stage` of this CTA
        T.ptx.mbarrier.arrive.shared.b64(self.buf.ptr_to([stage]))
        TL.point(TL.RELEASE, stage)

    @T.inline
    def arrive_expect_tx(self, stage, nbytes):
        # one arrival that also tells barrier `stage` to expect `nbytes` more bytes (TMA)
        T.ptx.mbarrier.arrive.expect_tx.shared.b64(self.buf.ptr_to([stage]), T.uint32(nbytes))

    def in_cta(self, rank):
        """The same barriers as they live in CTA ``rank`` of this cluster (mapa), for the
        2-CTA TMA (its completion barrier) and remote arrivals (:meth:`arrive_remote`)."""
        return Barriers(None, self.depth, self.name,
                        buf=barriers_in_cta(self.buf, self.depth, rank))

    @T.inline
    def arrive_remote(self, stage):
        # one arrival on barrier `stage` in the CTA this view (from in_cta) lives in
        T.ptx.mbarrier.arrive.shared__cluster.b64(self.buf.ptr_to([stage]))


@T.meta_class
class Ring:
    """A full/empty pair of :class:`Barriers` around ``depth`` slots (a ring of SMEM
    stages, or of TMEM accumulators), with both arrival counts declared once, where the
    ring is made::

        stages = H.Ring(pool, PIPE_DEPTH, "tma2mma", 1, "mma2tma", 1)
        tma2mma = stages.full   # the two Barriers, used as before
        mma2tma = stages.empty
        stages.init()           # the init thread: every slot of both barriers

    ``full`` (producer -> consumer: the slot holds data) completes a phase on
    ``full_count`` arrivals, ``empty`` (consumer -> producer: the slot may be refilled) on
    ``empty_count``; ``full`` is allocated first, then ``empty``, as two plain arrays."""

    def __init__(self, pool, depth: int, full: str, full_count, empty: str, empty_count):
        self.full = Barriers(pool, depth, full)
        self.empty = Barriers(pool, depth, empty)
        self.full_count = full_count
        self.empty_count = empty_count

    @T.inline
    def init(self):
        # one thread: both barriers' inits; then every thread publishes them (publish_setup)
        self.full.init(self.full_count)
        self.empty.init(self.empty_count)


def barriers_in_cta(bars, depth, rank):
    """The barrier array ``bars`` (a buffer) as it lives in CTA ``rank`` of this cluster.

    Plain Python (called in the kernel body): mapa turns this CTA's address of ``bars``
    into the generic address of the same array in the peer's shared memory.
    """
    mapped = T.alloc_local((1,), "uint64")
    T.evaluate(T.ptx.mapa.u64(mapped[0], bars.ptr_to([0]), T.uint32(rank)))
    ptr_type = tvm.ir.PointerType(tvm.ir.PrimType("uint64"), "shared")
    ptr = tvm.tirx.Var("peer_bars", ptr_type)
    T.Bind(T.reinterpret(ptr_type, mapped[0]), var=ptr)
    return T.decl_buffer((depth,), "uint64", data=ptr, scope="shared")


# --------------------------------------------------------------------------------------
# TMA loads and stores, SMEM fences and bulk groups (both arches)
# --------------------------------------------------------------------------------------
# TMA copies are "tma_explicit": one tensor map per global tensor with its true extents
# (M x K, N x K, M x N), a box of one 128-byte swizzle atom wide, so a box that reaches past
# the tensor's edge is legal: a load zero-fills the outside part (and still counts the whole
# box's bytes on the mbarrier), a store drops it. "tma_auto" would refuse any extent that
# is not a multiple of the swizzle atom (64 elements).
TMA = "tma_explicit"


def tma_hints(l2_promotion=None, cache_hint=None, prefetch_map: bool = False) -> dict:
    """Extra TMA copy settings, only those given (none: TVM's defaults, 128-byte L2
    promotion and no cache policy): the tensor map's L2 promotion ("L2::64B", "L2::128B",
    "L2::256B": how much of the surrounding line a miss brings into L2), the copy's L2
    cache policy ("evict_first" for data read once, "evict_last" for data read again) and
    ``prefetch_map``: TVM adds a prefetch.tensormap of the copy's descriptor, by the
    CTA's first warp at kernel entry."""
    out = {}
    if prefetch_map:
        out["prefetch_tensormap"] = True
    if l2_promotion is not None:
        out["tensormap_l2_promotion"] = l2_promotion
    if cache_hint is not None:
        out["cache_hint"] = cache_hint
    return out


@T.inline
def tma_load_tiles(Asmem, Bsmem, A, B, m_st, n_st, k_st, BLK_M, BLK_N, BLK_K, bar,
                   a_hints=None, b_hints=None):
    # one thread (both arches): the arrival that tells `bar` how many bytes to expect,
    # then two TMA tile copies that complete on `bar`; the phase completes once this
    # thread has arrived and every byte has landed (zero-filled edge bytes count too).
    # a_hints / b_hints: tma_hints(...) for A's and B's copies (None: the defaults)
    TL.point(TL.TMA_ISSUE, k_st // BLK_K, TL.PRODUCER)
    T.ptx.mbarrier.arrive.expect_tx.shared.b64(
        bar, T.uint32((BLK_M * BLK_K + BLK_N * BLK_K) * ELEM_BYTES))
    Tx.copy_async(Asmem, A[m_st:m_st + BLK_M, k_st:k_st + BLK_K], dispatch=TMA, mbar=bar,
                  **(a_hints or {}))
    Tx.copy_async(Bsmem, B[n_st:n_st + BLK_N, k_st:k_st + BLK_K], dispatch=TMA, mbar=bar,
                  **(b_hints or {}))


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
def fence_proxy_async():
    # order this thread's ordinary (generic-proxy) SMEM accesses against the async proxy
    # (TMA, tensor cores): before async reads of what it wrote, or after the async side
    # finished reading what it is about to overwrite
    T.ptx.fence.proxy.async_.shared__cta()


@T.inline
def store_commit():
    # one thread: close the TMA stores it issued since the last commit into one bulk group
    T.ptx.cp.async_.bulk.commit_group()
    TL.begin(TL.STORE)


@T.inline
def store_wait(n):
    # one thread: wait until at most `n` of its bulk groups are pending (0: all stores done)
    T.ptx.cp.async_.bulk.wait_group(n)
    TL.drain(TL.STORE, n)


@T.inline
def store_wait_read(n):
    # as store_wait, but only until the stores have READ their SMEM source (which may then
    # be overwritten); their writes to GMEM may still be in flight
    T.ptx.cp.async_.bulk.wait_group.read(n)
    TL.drain(TL.STORE, n)



SMEM_BYTES_MAX = spec.SMEM_BYTES_MAX  # opt-in dynamic shared memory per CTA (sm_90, sm_100)
SMEM_RESERVED_BYTES = spec.SMEM_RESERVED_BYTES  # barriers and alignment
ring_stages = spec.ring_stages  # stages that fit beside staging: the default ring depth


def check_pipe_depth(PIPE_DEPTH: int, bytes_per_stage: int, other_bytes: int = 0) -> None:
    if isinstance(PIPE_DEPTH, bool) or not isinstance(PIPE_DEPTH, int) or PIPE_DEPTH < 1:
        raise ValueError(f"PIPE_DEPTH={PIPE_DEPTH!r} must be an int >= 1")
    need = PIPE_DEPTH * bytes_per_stage + other_bytes + spec.SMEM_RESERVED_BYTES
    if need > SMEM_BYTES_MAX:
        raise ValueError(
            f"PIPE_DEPTH={PIPE_DEPTH} needs ~{need // 1024} KiB of shared memory, more than "
            f"the {SMEM_BYTES_MAX // 1024} KiB a CTA may use")


# Loop annotation that keeps a K-loop rolled (`#pragma unroll 1`): nvcc would otherwise
# unroll a 64-trip K-loop completely (256 MMA instructions, a 170 KiB cubin, slow builds)
# and SASS counts would depend on the shape.
# The value is the boolean True (what TVM's own unroll=False emits); NumSim rejects 1.
ROLLED = {"disable_unroll": True}


# --------------------------------------------------------------------------------------
# the split-K counter protocol (v11, both arches; the split rules are in tirx_gemm.splitk)
# --------------------------------------------------------------------------------------
# A unit (split s of a tile) publishes its fp32 partial to slab WS[s, tile], counts itself
# on the tile's counter, and either (REDUCE="last") the unit that counts last sums all
# slabs in split order, or (REDUCE="spread") every unit waits for all (splitk.wait_count)
# and sums its own band in split order, the last past its band resetting the counters.
# A slab holds thread-major chunks: chunk c of thread t of the 128 is at float c*128 + t
# (times SPLITK_CHUNK), from a ``base`` offset (sm_90a: each consumer's half).
SPLITK_CHUNK = 4  # floats per slab store / load of one thread (16 bytes)


@T.inline
def splitk_publish(WS, split, tile, base, part, n, tid):
    # this thread's n fp32 partial values -> slab WS[split, tile], chunk c at float offset
    # base + (c * 128 + tid) * 4; a warpgroup barrier must follow before the count
    for c in T.unroll(n // SPLITK_CHUNK):
        slot = T.meta_var(base + (c * 128 + tid) * SPLITK_CHUNK)
        Tx.copy(WS[split, tile, slot:slot + SPLITK_CHUNK],
                part[c * SPLITK_CHUNK:(c + 1) * SPLITK_CHUNK])


@T.inline
def splitk_count_arrival(arrivals, i, counter):
    # one thread, after the barrier that follows every slab store of its warpgroup: +1 on
    # the tile's counter at gpu scope, acq_rel (release: this unit's slab before its count;
    # acquire: the slabs of the units counted before it). The count before this unit's ->
    # SMEM arrivals[i], for the whole warpgroup after the next barrier
    old = T.alloc_local((1,), "int32")
    T.ptx["atom.acq_rel.gpu.global.add.s32"](old[0], counter, T.int32(1))
    arrivals[i] = old[0]


def splitk_is_last(arrivals, i, SPLIT_K):
    """REDUCE="last": this unit counted last (SPLIT_K - 1 before it), so every slab of the
    tile is published and this unit reduces it."""
    return arrivals[i] == SPLIT_K - 1


@T.inline
def splitk_reduce_slabs(WS, tile, base, acc, n, SPLIT_K, IN_FLIGHT, tid):
    # REDUCE="last": acc[0:n] = slab 0 + slab 1 + ... + slab SPLIT_K - 1 at this thread's
    # chunks, in that fixed order (the same bits whatever order the units finished in);
    # IN_FLIGHT chunks of one slab are loaded together before their adds
    for c in T.unroll(n):
        acc[c] = T.float32(0)
    chunk = T.alloc_local((IN_FLIGHT * SPLITK_CHUNK,), ACC_DTYPE)
    for b in T.unroll(n // SPLITK_CHUNK // IN_FLIGHT):
        for s in T.serial(SPLIT_K, annotations=ROLLED):
            for i in T.unroll(IN_FLIGHT):  # loads in flight together
                slot = T.meta_var(base + ((b * IN_FLIGHT + i) * 128 + tid) * SPLITK_CHUNK)
                Tx.copy(chunk[i * SPLITK_CHUNK:(i + 1) * SPLITK_CHUNK],
                        WS[s, tile, slot:slot + SPLITK_CHUNK])
            for i in T.unroll(IN_FLIGHT * SPLITK_CHUNK):
                acc[b * IN_FLIGHT * SPLITK_CHUNK + i] = (
                    acc[b * IN_FLIGHT * SPLITK_CHUNK + i] + chunk[i])


@T.inline
def splitk_band_add(WS, tile, base, band, chunk, s0, count, q0, q1, tid, BAND_ITERS):
    # REDUCE="spread": band += slabs s0 .. s0 + count - 1 at this thread's chunks q0 + tid,
    # q0 + tid + 128, ... (those < q1) from float offset `base`: every load first (in
    # flight together), then the adds, slab by slab in split order
    for i in T.unroll(BAND_ITERS):
        if q0 + i * 128 + tid < q1:
            for s in T.unroll(count):
                slot = T.meta_var(base + (q0 + i * 128 + tid) * 4)
                Tx.copy(chunk[(s * BAND_ITERS + i) * 4:(s * BAND_ITERS + i + 1) * 4],
                        WS[s0 + s, tile, slot:slot + 4])
    for s in T.unroll(count):
        for i in T.unroll(BAND_ITERS):
            if q0 + i * 128 + tid < q1:
                for e in T.unroll(4):
                    band[i * 4 + e] = band[i * 4 + e] + chunk[(s * BAND_ITERS + i) * 4 + e]


@T.inline
def splitk_reduce_band(WS, tile, base, band, q0, q1, SPLIT_K, GROUP, tid, BAND_ITERS):
    # REDUCE="spread", after the wait for all SPLIT_K counts: band (BAND_ITERS * 4 fp32,
    # this thread's chunks q0 + tid, q0 + tid + 128, ... of [q0, q1), from float offset
    # `base`) = slab 0 + slab 1 + ... + slab SPLIT_K - 1, in that fixed order: zeroed, then
    # splitk_band_add over GROUP slabs at a time (their GROUP * BAND_ITERS chunk loads in
    # flight together) and the SPLIT_K % GROUP left over
    for c in T.unroll(BAND_ITERS * SPLITK_CHUNK):
        band[c] = T.float32(0)
    chunk = T.alloc_local((GROUP * BAND_ITERS * SPLITK_CHUNK,), ACC_DTYPE)
    for g in T.serial(SPLIT_K // GROUP, annotations=ROLLED):
        splitk_band_add(WS, tile, base, band, chunk, g * GROUP, GROUP, q0, q1, tid, BAND_ITERS)
    if SPLIT_K % GROUP > 0:
        splitk_band_add(WS, tile, base, band, chunk, SPLIT_K // GROUP * GROUP, SPLIT_K % GROUP,
                        q0, q1, tid, BAND_ITERS)


@T.inline
def splitk_store_band(D, band, q0, q1, m_st, n_st, row_off, ROWS, COLS, BAND_ITERS, tid,
                      transposed: bool = False):
    # REDUCE="spread": this thread's reduced chunks q0 + tid + 128 i (< q1) of a 64-row half
    # -> D. Chunk q is acc[4j .. 4j+3] of thread t (j = q // 128, t = q % 128, warp w =
    # t // 32, lane l = t % 32): acc[4j+2h+e] is row 16w + l//4 + 8h (+ row_off), column
    # 8j + 2(l%4) + e of the tile at (m_st, n_st). COLS a multiple of 8: a pair is all in
    # or out. transposed (v12's SWAP_AB): the tile holds D's transpose, element (r, c) goes
    # to D[n_st + c, m_st + r] (ROWS: D's columns, COLS: its rows, any count), one by one
    for i in T.unroll(BAND_ITERS):
        q = T.meta_var(q0 + i * 128 + tid)
        if q < q1:
            t = T.meta_var(q % 128)
            c0 = T.meta_var(q // 128 * 8 + t % 32 % 4 * 2)
            for h in T.unroll(2):
                r = T.meta_var(row_off + t // 32 * 16 + t % 32 // 4 + 8 * h)
                if m_st + r < ROWS:
                    if transposed:
                        for e in T.unroll(2):
                            if n_st + c0 + e < COLS:
                                val = T.alloc_local((1,), D.dtype)
                                val[0] = T.Cast(D.dtype, band[i * SPLITK_CHUNK + 2 * h + e])
                                D[n_st + c0 + e, m_st + r] = val[0]
                    else:
                        if n_st + c0 < COLS:
                            out = T.alloc_local((2,), D.dtype)
                            Tx.cast(out[:], band[i * SPLITK_CHUNK + 2 * h:
                                                 i * SPLITK_CHUNK + 2 * h + 2])
                            Tx.copy(D[m_st + r, n_st + c0:n_st + c0 + 2], out[:])


@T.inline
def splitk_retire_spread(CNT, count_i, done_i, SPLIT_K):
    # REDUCE="spread", one thread after the barrier that follows its band: +1 on the tile's
    # second counter CNT[done_i], acq_rel (every unit's wait on CNT[count_i] is ordered
    # before the reset); the last unit past its band zeroes both for the next launch
    done = T.alloc_local((1,), "int32")
    T.ptx["atom.acq_rel.gpu.global.add.s32"](done[0], CNT.ptr_to([done_i]), T.int32(1))
    if done[0] == SPLIT_K - 1:
        CNT[count_i] = 0
        CNT[done_i] = 0


def without_operand(func, name: str):
    """``func`` with its parameter ``name`` removed, refused (ValueError) if the body reads
    or writes that buffer: how one builder source serves the operand lists with and without
    an optional operand (v9's ``bias``; v14's ``scale``, ``bias``, ``WS``, ``CNT``) and still
    compiles the plain kernel unchanged."""
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
