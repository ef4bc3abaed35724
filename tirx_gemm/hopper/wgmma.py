"""The wgmma engine: hardware constants, descriptors, wgmma issue, the operand fence, group verbs, setup."""

from __future__ import annotations

from tvm.script import tirx as T

from .. import helpers as H
from .. import timeline as TL  # event hooks: None (nothing emitted) unless TIMELINE=True
from ..helpers import AB_DTYPE, ELEM_BYTES  # noqa: F401 (bytes of one 16-bit element: fp16, bf16)

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
DESC_K16_STEP = (WGMMA_K * ELEM_BYTES) >> 4  # 32 B per k16 slice = 2
DESC_M64_STEP = (WGMMA_M * 128) >> 4        # 8192 B per 64-row block = 512


def tile_bytes(rows: int, cols: int) -> int:
    """Bytes of one 16-bit tile: the transaction count a TMA load of it reports (also for
    a box that reaches past the tensor's edge: the zero-filled part counts too)."""
    return rows * cols * ELEM_BYTES


# the PTX type of each operand dtype in the wgmma mnemonic
_WGMMA_TYPE = {"float16": "f16", "bfloat16": "bf16"}


def wgmma_name(n: int, dtype: str = AB_DTYPE) -> str:
    """PTX mnemonic of the 16-bit x 16-bit -> fp32 wgmma with both operands in SMEM
    (dtype float16: ``...f32.f16.f16``, bfloat16: ``...f32.bf16.bf16``)."""
    H.check_dtype(dtype)
    t = _WGMMA_TYPE[str(dtype)]
    return f"wgmma.mma_async.sync.aligned.m64n{n}k16.f32.{t}.{t}"


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


# --- names parallel to tirx_gemm.helpers (sm_100a), so the two tracks read side by side ---
@T.inline
def publish_smem_writes():
    # thread stores (st.shared, the generic proxy) are not seen by wgmma (the async proxy)
    # through a CTA barrier alone: each writer fences its own stores into the async proxy,
    # then the barrier makes sure every thread's share has landed before any wgmma reads it
    T.ptx.fence.proxy.async_.shared__cta()
    T.cuda.cta_sync()
