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

# D = A @ B.T: fp16 operands, fp32 accumulation, fp16 output.
AB_DTYPE = "float16"
ACC_DTYPE = "float32"
F16_BYTES = 2
SUPPORTED_DTYPES = ("float16",)


# --------------------------------------------------------------------------------------
# argument validation: every builder calls these before it builds anything
# --------------------------------------------------------------------------------------
def check_dtype(dtype: str) -> None:
    if str(dtype) not in SUPPORTED_DTYPES:
        raise ValueError(
            f"dtype={dtype!r} is not supported: these steps compute fp16 x fp16 -> fp32 "
            f"accumulate -> fp16 (dtype must be one of {SUPPORTED_DTYPES})"
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

    All 512 columns are allocated, so the allocation's base column is 0 and the view can
    be declared at offset 0 (TIRx 0.27 takes a column offset, not the allocated address).
    """
    return T.decl_buffer((128, TMEM_COLS), ACC_DTYPE, scope="tmem", allocated_addr=0,
                         layout=TileLayout(S[(128, TMEM_COLS): (1 @ TLane, 1 @ TCol)]))


@T.inline
def init_mbarrier(bar, count):
    T.ptx.mbarrier.init.shared.b64(bar, T.uint32(count))


@T.inline
def wait_mbarrier(bar, phase):
    # returns once the barrier has left `phase` (the phase we are waiting to complete)
    T.cuda.mbarrier_wait(bar, phase)


@T.inline
def tmem_alloc(tmem_addr):
    # warp-wide (.sync.aligned): all 32 lanes of one warp must execute it
    T.ptx["tcgen05.alloc.cta_group::1.sync.aligned.shared::cta.b32"](
        T.address_of(tmem_addr[0]), T.uint32(TMEM_COLS))


@T.inline
def tmem_free(tmem_addr):
    # warp-wide, by the warp that allocated; releasing the permit lets the next CTA on
    # this SM allocate without waiting for this one to exit
    T.ptx["tcgen05.relinquish_alloc_permit.cta_group::1.sync.aligned"]()
    T.ptx["tcgen05.dealloc.cta_group::1.sync.aligned.b32"](tmem_addr[0], T.uint32(TMEM_COLS))


@T.inline
def publish_setup():
    # make barrier inits and the TMEM address slot visible to every thread and to the
    # async proxy (TMA, tensor cores) before anyone touches them
    T.ptx.fence.proxy.async_.shared__cta()
    T.ptx["fence.mbarrier_init.release.cluster"]()
    T.cuda.cta_sync()


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
def tma_load_tiles(Asmem, Bsmem, A, B, m_st, n_st, k_st, BLK_M, BLK_N, BLK_K, bar):
    # one thread (both arches): the arrival that tells `bar` how many bytes to expect,
    # then two TMA tile copies that complete on `bar`; the phase completes once this
    # thread has arrived and every byte has landed
    T.ptx.mbarrier.arrive.expect_tx.shared.b64(
        bar, T.uint32((BLK_M * BLK_K + BLK_N * BLK_K) * F16_BYTES))
    Tx.copy_async(Asmem, A[m_st:m_st + BLK_M, k_st:k_st + BLK_K], dispatch="tma_auto",
                  mbar=bar)
    Tx.copy_async(Bsmem, B[n_st:n_st + BLK_N, k_st:k_st + BLK_K], dispatch="tma_auto",
                  mbar=bar)


@T.inline
def tmem_to_registers(tmem, col, BLK_N, Dreg_f16):
    # each thread of the warpgroup reads one accumulator row (TMEM lane = row) from
    # columns [col, col + BLK_N) as fp32, waits for the asynchronous tcgen05.ld, then
    # narrows to fp16
    Dreg = T.alloc_local((BLK_N,), ACC_DTYPE)
    Dreg_wg = Dreg.view(128, BLK_N, layout=TileLayout(S[(128, BLK_N): (1 @ tid_in_wg, 1)]))
    Tx.wg.copy_async(Dreg_wg[:, :], tmem[:, col:col + BLK_N])
    T.ptx["tcgen05.wait::ld.sync.aligned"]()
    Tx.cast(Dreg_f16[:], Dreg[:])


@T.inline
def epilogue_to_gmem(tmem, D, m_st, n_st, BLK_N, row):
    # TMEM -> registers -> GMEM: thread `row` of the warpgroup stores output row m_st + row
    Dreg_f16 = T.alloc_local((BLK_N,), AB_DTYPE)
    tmem_to_registers(tmem, 0, BLK_N, Dreg_f16)
    Tx.copy(D[m_st + row, n_st:n_st + BLK_N], Dreg_f16[:])


@T.inline
def store_tile_via_tma(Dreg_f16, Dsmem, D, m_st, n_st, BLK_M, BLK_N, row, is_leader, bar_id):
    # registers -> swizzled Dsmem -> (one thread) TMA store -> GMEM; `bar_id` names the
    # barrier that syncs the 128 threads of the storing warpgroup
    Tx.copy(Dsmem[row, 0:BLK_N], Dreg_f16[:])
    # generic-proxy SMEM writes must be fenced before the async proxy (TMA) reads them
    T.ptx.fence.proxy.async_.shared__cta()
    T.cuda.warpgroup_sync(bar_id)
    if is_leader:
        Tx.copy_async(D[m_st:m_st + BLK_M, n_st:n_st + BLK_N], Dsmem[:, :],
                      dispatch="tma_auto")
        T.ptx.cp.async_.bulk.commit_group()
        # Dsmem may be overwritten only after the store has read it
        T.ptx.cp.async_.bulk.wait_group(0)
    T.cuda.warpgroup_sync(bar_id)


@T.inline
def epilogue_to_tma_store(tmem, Dsmem, D, m_st, n_st, BLK_M, BLK_N, row, is_leader,
                          bar_id):
    # TMEM -> registers -> swizzled Dsmem -> (one thread) TMA store -> GMEM
    Dreg_f16 = T.alloc_local((BLK_N,), AB_DTYPE)
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


def check_phase_parity(K_TILES: int, PIPE_DEPTH: int) -> None:
    """A kernel that resets its barrier phases to 0 per output tile needs every barrier to
    complete an even number of phases per tile (mma_bar: K_TILES, tma_bar[s]:
    K_TILES / PIPE_DEPTH)."""
    if K_TILES % (2 * PIPE_DEPTH) != 0:
        raise ValueError(
            f"K_TILES={K_TILES} (K/BLK_K) is not a multiple of 2*PIPE_DEPTH={2 * PIPE_DEPTH}: "
            "barrier phases restart at 0 for every output tile, so each barrier must "
            "complete an even number of phases per tile")


# Loop annotation that keeps a K-loop rolled (`#pragma unroll 1`): nvcc would otherwise
# unroll a 64-trip K-loop completely (256 MMA instructions, a 170 KB cubin, slow builds)
# and SASS counts would depend on the shape.
ROLLED = {"disable_unroll": 1}
