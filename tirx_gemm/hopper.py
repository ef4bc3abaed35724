"""Hopper (sm_90a) building blocks: the wgmma engine, the twin of :mod:`tirx_gemm.blackwell`.

On Hopper the tensor cores are driven by ``wgmma``: one *warpgroup* (128 threads)
issues ``wgmma.mma_async`` together, the operands are read from shared memory through
64-bit *matrix descriptors*, and the fp32 accumulators live in the registers of the
issuing warpgroup (no TMEM). TIRx 0.27 has no tile primitive that dispatches to wgmma
(``Tx.gemm_async`` targets tcgen05 only), so the steps issue the PTX directly, and the
pieces every step needs live here once:

* descriptor encoding and the byte arithmetic that walks a 128B-swizzled K-major tile,
* ``wgmma_tile``: the wgmma calls that consume one BLK_K slice of A and B,
* the operand fence that pins accumulator registers behind ``wgmma.wait_group``,
* the wgmma group verbs (``mma_fence``, ``mma_commit``, ``mma_wait``) and the setup
  publication (``publish_setup``), named like their sm_100a twins in
  :mod:`tirx_gemm.blackwell`,
* the fragment epilogue ``store_fragment``: to GMEM (v1-v3) or to a
  swizzled SMEM tile for a TMA store (v4+), and ``tma_store_tile``, the TMA store of such
  a tile (one box per 64-column swizzle atom, clipped at D's edges),
* ``check_ctas_fit_sm`` (persistent pools, v6).
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

from tvm.script import tirx as T
from tvm.script.tirx import tile as Tx

from . import helpers as H
from . import timeline as TL  # event hooks: None (nothing emitted) unless TIMELINE=True
from .helpers import ACC_DTYPE, AB_DTYPE, F16_BYTES


# --------------------------------------------------------------------------------------
# hardware constants
# --------------------------------------------------------------------------------------
WGMMA_M = 64                # rows of one wgmma (per warpgroup)
WGMMA_K = 16                # K of one 16-bit (fp16 / bf16) wgmma
SWIZZLE_ROW_ELEMS = 64      # 16-bit elements in one 128-byte swizzle row: BLK_K of every step
SMEM_ALIGN = 1024           # one 128B swizzle atom (8 rows x 128 B): tiles start on it
SMEM_PER_SM_BYTES = 228 * 1024  # shared memory of one SM, shared by its resident CTAs
SMEM_RESERVED_PER_CTA = 1024    # taken by the system from every resident CTA

# encode_matrix_descriptor arguments (16-byte units; swizzle code 3 = 128B swizzle)
SWIZZLE_128B = 3
DESC_LBO = 1                # unused for swizzled K-major operands
DESC_SBO = (8 * 128) >> 4   # 8 rows x 128 B between consecutive 8-row groups = 64
DESC_K16_STEP = (WGMMA_K * F16_BYTES) >> 4  # 32 B per k16 slice = 2
DESC_M64_STEP = (WGMMA_M * 128) >> 4        # 8192 B per 64-row block = 512


def tile_bytes(rows: int, cols: int) -> int:
    """Bytes of one 16-bit tile: the transaction count a TMA load of it reports (also for
    a box that reaches past the tensor's edge: the zero-filled part counts too)."""
    return rows * cols * F16_BYTES


# the PTX type of each operand dtype in the wgmma mnemonic
_WGMMA_TYPE = {"float16": "f16", "bfloat16": "bf16"}


def wgmma_name(n: int, dtype: str = AB_DTYPE) -> str:
    """PTX mnemonic of the 16-bit x 16-bit -> fp32 wgmma with both operands in SMEM
    (dtype float16: ``...f32.f16.f16``, bfloat16: ``...f32.bf16.bf16``)."""
    H.check_dtype(dtype)
    t = _WGMMA_TYPE[str(dtype)]
    return f"wgmma.mma_async.sync.aligned.m64n{n}k16.f32.{t}.{t}"


def check_ctas_fit_sm(ctas_per_sm: int, smem_bytes_per_cta: int) -> None:
    """A persistent pool of ctas_per_sm CTAs per SM must be resident at once, or the CTAs
    beyond the first wave only start when others have finished all their tiles."""
    need = ctas_per_sm * (smem_bytes_per_cta + SMEM_RESERVED_PER_CTA)
    if need > SMEM_PER_SM_BYTES:
        raise ValueError(
            f"CTAS_PER_SM={ctas_per_sm} CTAs of {smem_bytes_per_cta} B shared memory each "
            f"need {need} B, more than the {SMEM_PER_SM_BYTES} B of one sm_90a SM")


# --------------------------------------------------------------------------------------
# descriptors
# --------------------------------------------------------------------------------------
@T.inline
def encode_desc(desc, tile_ptr):
    """desc[0] <- descriptor of a 1024-aligned, 128B-swizzled, K-major 16-bit tile."""
    T.cuda.wgmma.encode_matrix_descriptor(
        T.address_of(desc[0]), tile_ptr, DESC_LBO, DESC_SBO, SWIZZLE_128B
    )


def desc_advance(desc_value, byte_offset):
    """The descriptor ``byte_offset`` bytes further on (``byte_offset`` may be a runtime
    expression, e.g. ``stage * STAGE_BYTES``; it must be a multiple of 16)."""
    if isinstance(byte_offset, int):
        return desc_value + T.uint64(byte_offset >> 4)
    return desc_value + T.Cast("uint64", byte_offset >> 4)


# --------------------------------------------------------------------------------------
# wgmma issue
# --------------------------------------------------------------------------------------
@T.inline
def wgmma_tile(acc, desc_a, desc_b, accumulate, m_blocks: int, n: int, dtype: str):
    """All wgmmas that consume one 64-wide K slice already resident in SMEM.

    ``desc_a`` / ``desc_b``: descriptors (values) of the A tile (``m_blocks * 64`` rows)
    and the B tile (``n`` rows), both ``(rows, 64)`` 128B-swizzled.
    ``acc``: ``m_blocks * n / 2`` fp32 registers per thread; block ``h`` owns
    ``acc[h * n/2 : (h+1) * n/2]`` (rows ``64h .. 64h+63`` of the tile).
    ``accumulate``: False on the very first K slice of an output tile (the hardware then
    computes D = A*B and ignores the stale registers, so no zero-fill is needed).
    ``dtype``: the operands' dtype (float16 or bfloat16), which picks the wgmma variant.
    Issue only: the caller brackets it with ``wgmma.fence`` / ``commit_group`` / ``wait_group``.
    """
    TL.begin(TL.WGMMA, accumulate)
    for kk in T.unroll(SWIZZLE_ROW_ELEMS // WGMMA_K):
        for h in T.unroll(m_blocks):
            T.ptx[wgmma_name(n, dtype)](
                *[acc[h * (n // 2) + i] for i in range(n // 2)],
                desc_a + T.Cast("uint64", h * DESC_M64_STEP + kk * DESC_K16_STEP),
                desc_b + T.Cast("uint64", kk * DESC_K16_STEP),
                T.ptx.pred(T.Or(accumulate, kk > 0)),
                1, 1, 0, 0,  # scale-a, scale-b, trans-a, trans-b (0 = K-major)
            )


# An empty asm statement that claims to read and write one accumulator register. Volatile
# asm statements keep their order, and every later use of the register depends on this
# one, so reads of the accumulators cannot be hoisted above wgmma.wait_group (the
# compiler does not know that wgmma writes them asynchronously).
_FENCE_F32_SRC = """
__device__ __forceinline__ void tirx_gemm_fence_f32(float& reg) {
  asm volatile("" : "+f"(reg) :: "memory");
}
"""


@T.inline
def fence_operands(acc, count: int):
    for i in T.unroll(count):
        T.cuda.func_call("tirx_gemm_fence_f32", acc[i], source_code=_FENCE_F32_SRC)


# --------------------------------------------------------------------------------------
# the wgmma group verbs and setup publication (names shared with tirx_gemm.blackwell)
# --------------------------------------------------------------------------------------
@T.inline
def mma_fence():
    # wgmma.fence: this warpgroup's earlier register accesses (accumulators written or
    # read) are ordered before the wgmmas issued after it
    T.ptx.wgmma.fence.sync.aligned()


@T.inline
def mma_commit():
    # close the wgmmas issued since the last commit into one wgmma group (the twin of
    # Blackwell's mma_commit(bar), which signals an mbarrier instead)
    T.ptx.wgmma.commit_group.sync.aligned()


@T.inline
def mma_wait(n):
    # wait until at most `n` of this warpgroup's wgmma groups are pending
    T.ptx.wgmma.wait_group.sync.aligned(n)
    TL.drain(TL.WGMMA, n)


@T.inline
def _publish_setup():
    # make the initialised barriers visible to the async proxy (TMA) and to every thread
    # (on Blackwell, W.publish_setup also publishes the TMEM allocation)
    T.ptx["fence.mbarrier_init.release.cluster"]()
    T.cuda.cta_sync()


def publish_setup():
    """Every thread, once, at the kernel's top level: publish the barrier inits (fence,
    CTA barrier). A TIMELINE build starts its recording here (TL.setup), so no step needs
    a line for it."""
    TL.setup()
    return _publish_setup()


# --------------------------------------------------------------------------------------
# epilogues
# --------------------------------------------------------------------------------------
@T.inline
def store_fragment(dst, acc, row0, col0, warp_id, lane_id, m_blocks: int, n: int):
    """Accumulators -> dst's dtype (fp16 or bf16) -> dst[row0 : row0 + 64*m_blocks,
    col0 : col0 + n], straight from registers; each thread writes pairs of neighbouring
    columns (one packed 2 x 16-bit word).
    dst = D (GMEM, v1-v3): a warp covers 8 rows x 8 columns per store, so the stores are
    only sector-sized -- fine for a first step, fixed by the SMEM + TMA store of v4.
    dst = Dsmem (a 128B-swizzled tile, the source of a TMA store, v4+): the swizzle makes
    these stores bank-conflict free (the 8 rows a warp writes land in 8 16-byte chunks)."""
    TL.begin(TL.EPILOGUE, TL.UNNAMED)  # ended by tma_store_tile, which knows the tile
    pair = T.alloc_local((2,), dst.dtype)
    for h in T.unroll(m_blocks):
        for j in T.unroll(n // 8):
            for hh in T.unroll(2):
                base = T.meta_var(h * (n // 2) + 4 * j + 2 * hh)
                row = T.meta_var(row0 + h * WGMMA_M + warp_id * 16 + lane_id // 4 + 8 * hh)
                col = T.meta_var(col0 + 8 * j + 2 * (lane_id % 4))
                pair[0] = T.Cast(dst.dtype, acc[base])
                pair[1] = T.Cast(dst.dtype, acc[base + 1])
                Tx.copy(dst[row, col : col + 2], pair[:])


@T.inline
def tma_store_tile(D, Dsmem, r0, m_st, n_st, rows: int, cols: int):
    """One thread: TMA-store rows [r0, r0 + rows) of the swizzled SMEM tile Dsmem to
    D[m_st : m_st + rows, n_st : n_st + cols] and commit it as one bulk group. One box per
    64-column swizzle atom (helpers.tma_store_swizzled); the tensor map has D's true
    extents, so rows and columns past D's edge are not written (an edge tile is clipped,
    no special code). The caller must have fenced the generic-proxy writes
    (``fence.proxy.async``) and synchronised the writers first, and must wait on the group
    before reusing Dsmem."""
    H.tma_store_swizzled(D, Dsmem, r0, m_st, n_st, rows, cols)
    T.ptx.cp.async_.bulk.commit_group()
    TL.end(TL.EPILOGUE, TL.tile_code(m_st, n_st))
    TL.begin(TL.STORE)


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
]


# --- clusters, multicast and overlapped epilogue (v8, v9) ---
# v8 and v9 launch CTAs in clusters of CLUSTER_SIZE = 2 (cluster dims (2, 1, 1), from
# T.cta_id_in_cluster): the two CTAs of a cluster compute vertically adjacent tiles, so
# they need the same B slice at every K step; each loads half of it and the TMA unit
# multicasts that half into both CTAs' shared memory. A CTA can address its peer's
# shared memory through the cluster's shared-memory window (mapa), which is how a
# consumer releases a stage in both CTAs.
from .helpers import F16_BYTES as _F16_BYTES  # noqa: E402
from tirx_gemm import spec  # noqa: E402

CLUSTER_SIZE = spec.CLUSTER_SIZE  # 2
CLUSTER_MASK = (1 << CLUSTER_SIZE) - 1  # multicast to every CTA of the cluster (0b11)


def check_ring_for_wait_one(PIPE_DEPTH: int) -> None:
    """A ring whose consumers keep one K slice's wgmmas in flight (``wait_group 1``) hands a
    stage back one K step late, so it needs a second stage to load into meanwhile: with a
    single stage the consumer waits for a load that waits for the consumer (measured on the
    H200: v9 at 300x264x200 with PIPE_DEPTH=1 hung until the host's guard stopped it)."""
    if isinstance(PIPE_DEPTH, int) and not isinstance(PIPE_DEPTH, bool) and PIPE_DEPTH == 1:
        raise ValueError("PIPE_DEPTH=1 cannot work here: the consumers keep one K slice's "
                         "wgmmas in flight (wait_group 1) and free its stage one K step "
                         "late, so a one-stage ring waits on itself; use PIPE_DEPTH >= 2")


def check_cluster_pool(SM_COUNT: int) -> None:
    """The persistent pool of a clustered step is made of whole clusters."""
    if SM_COUNT % CLUSTER_SIZE != 0:
        raise ValueError(f"SM_COUNT={SM_COUNT} is not a multiple of the cluster size "
                         f"{CLUSTER_SIZE}: the persistent pool is made of CTA pairs")


def check_reg_split(producer_regs: int, consumer_regs: int, num_consumers: int) -> None:
    """A setmaxnreg split: multiples of 8 in [24, 256] (PTX's rule) whose total over one
    producer and ``num_consumers`` consumer warpgroups fits the SM's 64K registers."""
    for name, regs in (("PRODUCER_REGS", producer_regs), ("CONSUMER_REGS", consumer_regs)):
        if isinstance(regs, bool) or not isinstance(regs, int) or not 24 <= regs <= 256 \
                or regs % 8:
            raise ValueError(f"{name}={regs!r} must be a multiple of 8 in [24, 256] "
                             f"(setmaxnreg's rule)")
    total = 128 * (producer_regs + num_consumers * consumer_regs)
    if total > 65536:
        raise ValueError(f"PRODUCER_REGS={producer_regs} + {num_consumers} x CONSUMER_REGS="
                         f"{consumer_regs} needs {total} registers per CTA, more than the "
                         f"SM's 65536")


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
                         BLK_N, bar):
    # one thread per CTA: expect every byte that lands in THIS CTA's stage (own A tile +
    # the whole BLK_N-row B tile, half of it written by the peer's multicast), then load
    # the own A tile (unicast) and B rows [nb_st, nb_st + B_ROWS) multicast into the same
    # offset of both CTAs, completing on the barrier at the same offset in each. Boxes
    # that reach past A's or B's edge are zero-filled and still count all their bytes: a
    # CTA whose rows all lie past M loads zeros, and its B half still feeds the peer
    TL.point(TL.TMA_ISSUE, k_st // BLK_K, TL.PRODUCER)
    T.ptx.mbarrier.arrive.expect_tx.shared.b64(
        bar, T.uint32((BLK_M + BLK_N) * BLK_K * _F16_BYTES))
    Tx.copy_async(Asmem, A[m_st:m_st + BLK_M, k_st:k_st + BLK_K], dispatch=H.TMA, mbar=bar)
    Tx.copy_async(Bsmem_half, B[nb_st:nb_st + B_ROWS, k_st:k_st + BLK_K],
                  dispatch=H.TMA, mbar=bar, cta_mask=CLUSTER_MASK)


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
def release_stage_in_cluster(mma2tma, stage, tid_in_wg):
    # one consumer warpgroup is done reading `stage` (after its wgmma.wait_group): threads
    # 0 .. CLUSTER_SIZE-1 each arrive on the stage's empty barrier in CTA tid_in_wg, so the
    # producer of every CTA whose multicast writes this stage learns it is free
    if tid_in_wg < CLUSTER_SIZE:
        T.cuda.func_call("tirx_gemm_arrive_cluster", mma2tma.buf.ptr_to([stage]), tid_in_wg,
                         source_code=_ARRIVE_CLUSTER_SRC)
        TL.point(TL.RELEASE, stage)


__all__ += [
    "CLUSTER_MASK",
    "CLUSTER_SIZE",
    "check_cluster_pool",
    "publish_setup_cluster",
    "release_stage_in_cluster",
    "tma_load_multicast_b",
]


# The overlapped epilogue of v9: the finished fp32 accumulators are packed to 16-bit
# pairs (fp16x2 or bf16x2, 64 registers) so that the next tile's wgmmas may overwrite the
# accumulators at once; the packed tile is then written to SMEM with stmatrix (which moves
# b16 pairs, whatever they encode) and TMA-stored while those wgmmas run.
# dtype -> (device function, its source): round-to-nearest conversion of two fp32 values
_PACK_FN = {
    "float16": ("tirx_gemm_pack_half2", """
__device__ __forceinline__ unsigned int tirx_gemm_pack_half2(float lo, float hi) {
  __half2 v = __floats2half2_rn(lo, hi);
  return *reinterpret_cast<unsigned int*>(&v);
}
"""),
    "bfloat16": ("tirx_gemm_pack_bfloat162", """
__device__ __forceinline__ unsigned int tirx_gemm_pack_bfloat162(float lo, float hi) {
  __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);
  return *reinterpret_cast<unsigned int*>(&v);
}
"""),
}

EPI_COLS = SWIZZLE_ROW_ELEMS  # columns of one TMA-store chunk: one 128-byte swizzle row


@T.inline
def pack_fragment(packed, acc, count: int, dtype: str):
    """packed[i] <- dtype x2 (acc[2i], acc[2i+1]) for i < count (dtype float16 or
    bfloat16, the output's). In the wgmma fragment,
    acc[4j+2h+e] is D[16w + l//4 + 8h, 8j + 2(l%4) + e], so packed[2j+h] holds the two
    neighbouring columns of row 8h + l//4 of 8x8 block j: the register of one stmatrix
    m8n8 matrix (thread l holds row l//4, columns 2(l%4), 2(l%4)+1)."""
    for i in T.unroll(count):
        packed[i] = T.cuda.func_call(_PACK_FN[dtype][0], acc[2 * i], acc[2 * i + 1],
                                     source_code=_PACK_FN[dtype][1], return_type="uint32")


@T.inline
def stmatrix_chunk(Dstage, wg, buf, packed, c, warp_id, lane_id):
    """Warpgroup ``wg`` writes columns [64c, 64c + 64) of its packed 64-row fragment into
    the staging tile Dstage[wg, buf] (64x64, 128B-swizzled) with four stmatrix.x4 per
    thread. Each x4 stores a 16x16 block: matrices (rows +0, cols j), (rows +8, cols j),
    (+0, j+1), (+8, j+1); lane L gives the address of row L % 8 of matrix L // 8. A matrix
    row is one 16-byte swizzle chunk, so the 8 rows of a matrix land in 8 different
    16-byte bank groups (no bank conflicts); ptr_to applies the swizzle."""
    q = T.meta_var(lane_id // 8)
    for i in T.unroll(EPI_COLS // 16):
        j = T.meta_var(c * (EPI_COLS // 8) + 2 * i)  # first 8-column block of this x4
        T.ptx.stmatrix.sync.aligned.m8n8.x4.shared.b16(
            Dstage.ptr_to([wg, buf, warp_id * 16 + (q % 2) * 8 + lane_id % 8,
                           8 * (2 * i + q // 2)]),
            packed[2 * j], packed[2 * j + 1], packed[2 * j + 2], packed[2 * j + 3])


@T.inline
def store_packed_tile(D, Dstage, wg, packed, m_st, n_st, n: int, bufs: int, warp_id,
                      lane_id, tid_in_wg, bar_id):
    """Warpgroup ``wg``: its packed 64 x n 16-bit fragment -> GMEM D[m_st:+64, n_st:+n], in
    64-column chunks through its ``bufs`` staging tiles Dstage[wg, b] (64x64, swizzled),
    one TMA store per chunk (one box, one swizzle atom wide; rows and columns past D's
    edge are not written, a chunk wholly past N writes nothing). Nothing waits for a
    store to reach GMEM: a staging tile is reused only once the store that last read it
    is done reading (wait_group.read(bufs-1): at most the bufs - 1 younger stores may
    still be pending), which has usually happened long before. The caller waits for all
    its stores (wait_group 0) before exiting."""
    TL.begin(TL.EPILOGUE, TL.tile_code(m_st, n_st))
    for c in T.unroll(n // EPI_COLS):
        if tid_in_wg == 0:
            T.ptx.cp.async_.bulk.wait_group.read(bufs - 1)
            TL.drain(TL.STORE, bufs - 1)
        T.cuda.warpgroup_sync(bar_id)  # the staging tile is free for all 128 writers
        stmatrix_chunk(Dstage, wg, c % bufs, packed, c, warp_id, lane_id)
        T.ptx.fence.proxy.async_.shared__cta()  # generic-proxy writes -> TMA unit
        T.cuda.warpgroup_sync(bar_id)
        if tid_in_wg == 0:
            Tx.copy_async(
                D[m_st:m_st + WGMMA_M, n_st + c * EPI_COLS:n_st + (c + 1) * EPI_COLS],
                Dstage[wg, c % bufs, :, :], dispatch=H.TMA)
            T.ptx.cp.async_.bulk.commit_group()
            TL.begin(TL.STORE)
    TL.end(TL.EPILOGUE, TL.tile_code(m_st, n_st))


__all__ += ["EPI_COLS", "pack_fragment", "stmatrix_chunk", "store_packed_tile"]


# --- names parallel to tirx_gemm.helpers (sm_100a), so the two tracks read side by side ---
@T.inline
def publish_smem_writes():
    # thread stores (st.shared, the generic proxy) are not seen by wgmma (the async proxy)
    # through a CTA barrier alone: each writer fences its own stores into the async proxy,
    # then the barrier makes sure every thread's share has landed before any wgmma reads it
    T.ptx.fence.proxy.async_.shared__cta()
    T.cuda.cta_sync()


__all__ += ["publish_smem_writes"]


# --- v12: narrow tiles. A tile whose width is not a multiple of the 64-column TMA-store
# chunk stores its last columns straight from the packed registers, one guarded 4-byte
# store per pair of columns (rows past M and columns past N are skipped).
_ST_GLOBAL_B32_SRC = """
__device__ __forceinline__ void tirx_gemm_st_global_b32(void* p, unsigned int v) {
  *reinterpret_cast<unsigned int*>(p) = v;
}
"""


@T.inline
def store_packed_guarded(D, packed, m_st, n_st, j_first: int, j_end: int, M, N, warp_id,
                         lane_id):
    """Warpgroup: 8-column blocks [j_first, j_end) of its packed 64-row fragment (see
    pack_fragment: packed[2j+h] holds row 16w + l//4 + 8h, columns 8j + 2(l%4) + {0, 1})
    -> D[m_st + row, n_st + col] with plain guarded stores. N is a multiple of 8 and
    n_st of 16, so a pair whose first column lies inside D lies inside it wholly. M may
    be a run-time variable. Nothing to fence: generic-proxy writes to GMEM."""
    for jj in T.unroll(j_end - j_first):
        for h in T.unroll(2):
            row = T.meta_var(m_st + warp_id * 16 + lane_id // 4 + 8 * h)
            col = T.meta_var(n_st + 8 * (j_first + jj) + 2 * (lane_id % 4))
            if row < M:
                if col < N:
                    T.cuda.func_call("tirx_gemm_st_global_b32", D.ptr_to([row, col]),
                                     packed[2 * (j_first + jj) + h],
                                     source_code=_ST_GLOBAL_B32_SRC)


__all__ += ["store_packed_guarded"]


# --- issue 28: the fused epilogue on the fp32 accumulator fragment, in registers, before
# the cast (the keywords, references and tolerances: tirx_gemm/epilogue.py). Each
# activation is one device function of one fp32 value. The build passes --use_fast_math:
# expf is then ex2.approx based (__expf, 2 + 1.16|x| ulp; written out below) and x / y
# takes __fdividef (2 ulp; 0 once y > 2**126, where silu's true value is below 1e-36 anyway);
# erff keeps its library form (2 ulp), but tanhf becomes tanh.approx.f32 (MUFU.TANH,
# 2**-11 relative: as large as fp16's rounding), so gelu_tanh is written without tanh:
# 0.5x(1 + tanh(y)) = x / (1 + exp(-2y)), exact algebra, the error of silu's form
_ACT_FN = {
    "relu": ("tirx_gemm_act_relu", """
__device__ __forceinline__ float tirx_gemm_act_relu(float x) { return fmaxf(x, 0.0f); }
"""),
    "gelu": ("tirx_gemm_act_gelu", """
__device__ __forceinline__ float tirx_gemm_act_gelu(float x) {
  return 0.5f * x * (1.0f + erff(x * 0.70710678118654752f));
}
"""),
    "gelu_tanh": ("tirx_gemm_act_gelu_tanh", """
__device__ __forceinline__ float tirx_gemm_act_gelu_tanh(float x) {
  float y = 0.79788456080286536f * (x + 0.044715f * x * x * x);
  return __fdividef(x, 1.0f + __expf(-2.0f * y));
}
"""),
    "silu": ("tirx_gemm_act_silu", """
__device__ __forceinline__ float tirx_gemm_act_silu(float x) {
  return __fdividef(x, 1.0f + __expf(-x));
}
"""),
}


@T.inline
def load_bias_fragment(bvals, n: int, bias, col0, N, lane_id):
    """bvals[2j+e] <- bias[col0 + 8j + 2(l%4) + e] as fp32 (0 past N): the n/4 bias values
    of this thread's columns of a 64 x n fragment, loaded once per tile (both rows h of a
    thread share a column). Called before the tile's last wgmma wait, so the loads (L2
    hits, issued back to back) are in flight while the last wgmmas run, not after them."""
    for j in T.unroll(n // 8):
        for e in T.unroll(2):
            col = T.meta_var(col0 + 8 * j + 2 * (lane_id % 4) + e)
            bvals[2 * j + e] = T.if_then_else(col < N, T.Cast(ACC_DTYPE, bias[col]),
                                              T.float32(0))


@T.inline
def epilogue_bias_act(acc, n: int, bvals, act):
    """acc[4j+2h+e] <- act(acc[4j+2h+e] + bvals[2j+e]) over a 64 x n fragment, the bias
    values from :func:`load_bias_fragment` (column 8j + 2(l%4) + e of the fragment).
    ``bvals`` None: no bias; ``act`` None: no activation."""
    for j in T.unroll(n // 8):
        for e in T.unroll(2):
            for h in T.unroll(2):
                if bvals is not None:
                    if act is not None:
                        acc[4 * j + 2 * h + e] = T.cuda.func_call(
                            _ACT_FN[act][0], acc[4 * j + 2 * h + e] + bvals[2 * j + e],
                            source_code=_ACT_FN[act][1], return_type=ACC_DTYPE)
                    else:
                        acc[4 * j + 2 * h + e] = acc[4 * j + 2 * h + e] + bvals[2 * j + e]
                else:
                    acc[4 * j + 2 * h + e] = T.cuda.func_call(
                        _ACT_FN[act][0], acc[4 * j + 2 * h + e],
                        source_code=_ACT_FN[act][1], return_type=ACC_DTYPE)


@T.inline
def epilogue_swiglu(acc, n: int):
    """SwiGLU on a 64 x n fragment of the fused gate/up weight (groups of 8 columns: gate,
    up, gate, ...; epilogue.SWIGLU_GROUP): 8-column block 2t holds the gate and block 2t+1
    the up values of the same 8 outputs at the same places, so
    acc[4t+2h+e] <- silu(acc[8t+2h+e]) * acc[8t+4+2h+e]. The n/4 results fill acc's first
    registers in the fragment layout of a 64 x n/2 accumulator (in place: register 4t+k is
    written only after 8t'+k' = 4t+k was read, t' < t)."""
    for t in T.unroll(n // 16):
        for k in T.unroll(4):
            acc[4 * t + k] = T.cuda.func_call(
                _ACT_FN["silu"][0], acc[8 * t + k], source_code=_ACT_FN["silu"][1],
                return_type=ACC_DTYPE) * acc[8 * t + 4 + k]


_ST_GLOBAL_F32X2_SRC = """
__device__ __forceinline__ void tirx_gemm_st_global_f32x2(void* row, int col, float lo,
                                                          float hi) {
  *reinterpret_cast<float2*>(reinterpret_cast<float*>(row) + col) = make_float2(lo, hi);
}
"""


@T.inline
def store_fragment_f32_guarded(D, acc, m_st, n_st, n: int, M, N, warp_id, lane_id):
    """Warpgroup: its fp32 64 x n fragment -> fp32 D[m_st + row, n_st + col] with one
    guarded 8-byte store per pair of columns (acc[4j+2h], acc[4j+2h+1] are neighbours; a
    quad of lanes writes one 32-byte sector of a row). N is a multiple of 8 and n_st of
    8, so a pair starting inside D lies inside it wholly and is 8-byte aligned. The
    registers are read at issue: the accumulators are free for the next wgmmas at once."""
    for h in T.unroll(2):  # one row per h: its guard and base once, then the columns
        row = T.meta_var(m_st + warp_id * 16 + lane_id // 4 + 8 * h)
        if row < M:
            for j in T.unroll(n // 8):
                col = T.meta_var(n_st + 8 * j + 2 * (lane_id % 4))
                if col < N:
                    # the row's address once, the column an offset (immediates in SASS)
                    T.cuda.func_call("tirx_gemm_st_global_f32x2", D.ptr_to([row, 0]), col,
                                     acc[4 * j + 2 * h], acc[4 * j + 2 * h + 1],
                                     source_code=_ST_GLOBAL_F32X2_SRC)


@T.inline
def store_fragment_transposed_guarded(D, acc, r_st, c_st, n: int, M, N, warp_id, lane_id):
    """Warpgroup, swap-AB (v12's SWAP_AB): its fp32 64 x n fragment holds D's transpose
    (fragment rows are D's columns, fragment columns D's rows), so element (row, col) goes
    to D[c_st + col, r_st + row], cast to D's dtype, one guarded 2-byte store each. The 8
    lanes with the same lane % 4 write 8 neighbouring columns of one row of D (16 bytes).
    A decode tile is small (n <= 64 rows of D), so the scattered stores cost little."""
    val = T.alloc_local((1,), D.dtype)
    for h in T.unroll(2):
        r = T.meta_var(r_st + warp_id * 16 + lane_id // 4 + 8 * h)
        if r < N:
            for j in T.unroll(n // 8):
                for e in T.unroll(2):
                    c = T.meta_var(c_st + 8 * j + 2 * (lane_id % 4) + e)
                    if c < M:
                        val[0] = T.Cast(D.dtype, acc[4 * j + 2 * h + e])
                        D[c, r] = val[0]


__all__ += ["load_bias_fragment", "epilogue_bias_act", "epilogue_swiglu",
            "store_fragment_f32_guarded", "store_fragment_transposed_guarded"]


# --- v13: fp8 (e4m3) operands. One byte per element, so a 128-byte swizzle row holds 128
# elements of K (BLK_K = 128 per stage) and one wgmma m64nNk32 consumes 32 of them: the
# descriptor walks the row in the same 32-byte steps as the 16-bit k16 wgmma (4 per
# row), so encode_desc, desc_advance and DESC_M64_STEP are reused unchanged. The kernel
# sees A and B as uint8 buffers (the e4m3 bit patterns; TMA copies bytes and the wgmma
# mnemonic says e4m3), and the scales as fp32 buffers.
FP8_BLK_K = 128             # e4m3 elements in one 128-byte swizzle row: BLK_K of v13
FP8_WGMMA_K = 32            # K of one e4m3 wgmma
FP8_STORAGE = "uint8"       # how the kernel's signature and SMEM hold e4m3 bits
FP8_OUT_DTYPES = ("bfloat16", "float16")


def fp8_tile_bytes(rows: int) -> int:
    """Bytes of one (rows, 128) e4m3 tile: rows x one 128-byte swizzle row."""
    return rows * FP8_BLK_K


def wgmma_fp8_name(n: int) -> str:
    """PTX mnemonic of the e4m3 x e4m3 -> fp32 wgmma, both operands in SMEM, K-major."""
    return f"wgmma.mma_async.sync.aligned.m64n{n}k32.f32.e4m3.e4m3"


@T.inline
def wgmma_fp8_tile(acc, desc_a, desc_b, accumulate, m_blocks: int, n: int):
    """All e4m3 wgmmas that consume one 128-wide K slice (one 128-byte row) in SMEM:
    4 x m64nNk32 per 64-row block, descriptors advanced 32 B per k32 (as wgmma_tile's
    k16 steps). ``accumulate`` False: the slice's first wgmma overwrites acc (scale-d 0)."""
    TL.begin(TL.WGMMA, accumulate)
    for kk in T.unroll(FP8_BLK_K // FP8_WGMMA_K):
        for h in T.unroll(m_blocks):
            T.ptx[wgmma_fp8_name(n)](
                *[acc[h * (n // 2) + i] for i in range(n // 2)],
                desc_a + T.Cast("uint64", h * DESC_M64_STEP + kk * DESC_K16_STEP),
                desc_b + T.Cast("uint64", kk * DESC_K16_STEP),
                T.ptx.pred(T.Or(accumulate, kk > 0)),
                1, 1,  # scale-a, scale-b (fp8 forms have no transpose: K-major only)
            )


@T.inline
def tma_load_fp8_tiles(Asmem, Bsmem, A, B, m_st, n_st, k_st, BLK_M, BLK_N, bar):
    # one thread: helpers.tma_load_tiles for one-byte elements (expect_tx counts bytes:
    # (BLK_M + BLK_N) x 128, zero-filled edge bytes included)
    TL.point(TL.TMA_ISSUE, k_st // FP8_BLK_K, TL.PRODUCER)
    T.ptx.mbarrier.arrive.expect_tx.shared.b64(
        bar, T.uint32((BLK_M + BLK_N) * FP8_BLK_K))
    Tx.copy_async(Asmem, A[m_st:m_st + BLK_M, k_st:k_st + FP8_BLK_K], dispatch=H.TMA,
                  mbar=bar)
    Tx.copy_async(Bsmem, B[n_st:n_st + BLK_N, k_st:k_st + FP8_BLK_K], dispatch=H.TMA,
                  mbar=bar)


@T.inline
def promote_fragment(acc, tmp, count: int, first, factor):
    """acc <- (first ? 0 : acc) + tmp * factor, per register (the promotion of a partial
    sum of the limited-precision fp8 accumulation into the fp32 accumulator). ``factor``
    is one value for the whole fragment (1.0, or a per-tensor scale)."""
    for i in T.unroll(count):
        acc[i] = T.if_then_else(first, T.float32(0), acc[i]) + tmp[i] * factor


@T.inline
def load_block_scales(sav, sbv, SA, SB, kb, KB, row0, n_st, n: int, M, N, warp_id, lane_id):
    """Block scaling: this thread's scales of K block ``kb`` into registers, issued before
    the promotion's wait_group so their latency hides under the wgmmas. sav[h] = SA[row,
    kb] for its rows row0 + 16w + l//4 + 8h (h = 0, 1); sbv[t] = SB[n_st // 128 + t, kb]
    for the ceil(n / 128) blocks of B the tile's columns lie in (n divides 128 or is 256,
    n_st is a multiple of n). Rows past M, blocks past N and a K block kb >= KB (the
    zero-filled stage of an odd K_TILES) read 0 (never stored, or multiplying zeros)."""
    for h in T.unroll(2):
        row = T.meta_var(row0 + warp_id * 16 + lane_id // 4 + 8 * h)
        sav[h] = T.if_then_else(T.And(row < M, kb < KB), SA[row, kb], T.float32(0))
    for t in T.unroll((n + 127) // 128):
        nb = T.meta_var(n_st // 128 + t)
        sbv[t] = T.if_then_else(T.And(nb * 128 < N, kb < KB), SB[nb, kb], T.float32(0))


@T.inline
def promote_fragment_block(acc, tmp, n: int, first, sav, sbv):
    """Block scaling's promotion: acc <- (first ? 0 : acc) + tmp * sa * sb with the scales
    of load_block_scales: register acc[4j + 2h + e] holds row 8h + .. (sav[h]) and column
    8j + .. (B block (8j) // 128 of the tile: sbv[8j // 128])."""
    for j in T.unroll(n // 8):
        for h in T.unroll(2):
            for e in T.unroll(2):
                acc[4 * j + 2 * h + e] = (
                    T.if_then_else(first, T.float32(0), acc[4 * j + 2 * h + e])
                    + tmp[4 * j + 2 * h + e] * (sav[h] * sbv[(8 * j) // 128]))


@T.inline
def scale_fragment(acc, count: int, factor):
    """acc *= factor (the per-tensor scale product, applied once in the epilogue)."""
    for i in T.unroll(count):
        acc[i] = acc[i] * factor


@T.inline
def scale_fragment_rows_cols(acc, n: int, SA, SB, row0, col0, M, N, warp_id, lane_id):
    """Row scaling in the epilogue: acc[r, c] *= SA[r] * SB[c] over the 64 x n fragment at
    (row0, col0) (thread (w, l) holds rows 16w + l//4 + 8h, columns 8j + 2(l%4) + e);
    each scale is read once per thread; rows past M and columns past N read 0 (never
    stored)."""
    sav = T.alloc_local((2,), "float32")
    sbv = T.alloc_local((2,), "float32")
    for h in T.unroll(2):
        row = T.meta_var(row0 + warp_id * 16 + lane_id // 4 + 8 * h)
        sav[h] = T.if_then_else(row < M, SA[row], T.float32(0))
    for j in T.unroll(n // 8):
        for e in T.unroll(2):
            col = T.meta_var(col0 + 8 * j + 2 * (lane_id % 4) + e)
            sbv[e] = T.if_then_else(col < N, SB[col], T.float32(0))
        for h in T.unroll(2):
            for e in T.unroll(2):
                acc[4 * j + 2 * h + e] = acc[4 * j + 2 * h + e] * (sav[h] * sbv[e])


__all__ += ["FP8_BLK_K", "FP8_OUT_DTYPES", "FP8_STORAGE", "FP8_WGMMA_K", "fp8_tile_bytes",
            "load_block_scales", "promote_fragment", "promote_fragment_block", "scale_fragment",
            "scale_fragment_rows_cols", "tma_load_fp8_tiles", "wgmma_fp8_name",
            "wgmma_fp8_tile"]
