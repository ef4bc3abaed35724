"""v13's fp8 verbs: e4m3 constants, the scaled fill (tensor, row), MXFP8 scale factors and block-scaled MMA."""

from __future__ import annotations

from tvm.script import tirx as T
from tvm.script.tirx import tile as Tx
from tvm.tirx.layout import S, TileLayout, tid_in_wg

from tirx_gemm import spec  # absolute: a hookless copy of this file reads the package's
from ..helpers import ACC_DTYPE


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
# sm_100a v13's epilogue scale modes; block-scaled MXFP8 (UE8M0 per 1x32, applied by the tensor
# core, on a CTA pair) is SCALE="mx" (hgemm_v13_mx); DeepSeek's 1x128 / 128x128 "block"
# scaling is sm_90a's only
FP8_SCALES = ("tensor", "row")


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
# On a CTA pair (cta_group::2, M = 256, N = 256) each CTA's TMEM holds the SFs of its own
# 128 rows of A and of all 256 rows of B (the MMA's joint N), so B's SFs are two atoms.
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


def mx_sf_cols(rows: int = MX_SF_ROWS) -> int:
    """TMEM columns one stage of SFs of ``rows`` rows takes: a 32-bit column holds the 4
    SFs of one 32-row group in each 32-lane quarter (4 for 128 rows, 8 for 256)."""
    return rows // 32


def mx_sf_layouts(pipe_depth: int, rows: int = MX_SF_ROWS):
    """(SMEM layout of a (pipe_depth, rows, 4) e8m0 view of the staged atoms, TMEM layout
    of a (pipe_depth, rows, 4) SF ring): TVM's tcgen05 block-scaled layouts for one SF per
    MMA (sf_per_mma=1, mxf8f6f4 with K = 32); rows a multiple of 128 (one atom each)."""
    from tvm.backend.cuda.tile_primitive.gemm_async.tcgen05 import sf_smem_layout, sf_tmem_layout
    return (sf_smem_layout(rows, MX_SF_K, 1, pipe_depth=pipe_depth),
            sf_tmem_layout(rows, MX_SF_K, 1, pipe_depth=pipe_depth))


def mx_sf_tmem(col: int, pipe_depth: int, rows: int = MX_SF_ROWS):
    """A (pipe_depth, rows, 4) e8m0 SF ring in TMEM from 32-bit column ``col``
    (mx_sf_cols(rows) columns per stage: 32 lanes x 4 bytes per column, replicated in
    each 32-lane quarter)."""
    return T.decl_buffer((pipe_depth, rows, MX_SF_K), MX_SF_DTYPE, scope="tmem",
                         allocated_addr=col, layout=mx_sf_layouts(pipe_depth, rows)[1])


@T.inline
def mx_sf_to_tmem_pair(sf_tmem, sf_smem):
    # one thread of CTA 0: tcgen05.cp.cta_group::2 of one stage's SFs, each CTA's SMEM at
    # these offsets into that CTA's TMEM (32x128b.warpx4 per 128-row atom; asynchronous: a
    # later tcgen05.mma of the same thread sees it, and tcgen05.commit tracks it)
    Tx.copy_async(sf_tmem, sf_smem, cta_group=2)


@T.inline
def mma_tile_mx_pair(tmem, col, Asmem, Bsmem, SFA, SFB, MMA_N, accum):
    # as mma_tile_pair, block-scaled: kind::mxf8f6f4.block_scale, M = 256 (128 rows from
    # each CTA), N = MMA_N, UE8M0 SFs from each CTA's TMEM (SFA its own rows, SFB all MMA_N)
    Tx.gemm_async(tmem[:, col:col + MMA_N], Asmem, Bsmem, SFA, SFB, accum=accum,
                  dispatch="tcgen05", cta_group=2)


# --- cta_group::1 forms (v14 SCALE="mx": one CTA per 128-row tile, its own TMEM) ---
@T.inline
def mx_sf_to_tmem(sf_tmem, sf_smem):
    # one thread: tcgen05.cp.cta_group::1 of one stage's SFs, this CTA's SMEM atom(s) into
    # its TMEM (32x128b.warpx4 per 128-row atom; ordered before the same thread's later
    # tcgen05.mma, tracked by its tcgen05.commit)
    Tx.copy_async(sf_tmem, sf_smem, cta_group=1)


@T.inline
def mma_tile_mx(tmem, col, Asmem, Bsmem, SFA, SFB, BLK_N, accum):
    # one thread: kind::mxf8f6f4.block_scale, M = 128 (this CTA's rows), N = BLK_N, UE8M0
    # SFs of A's 128 rows and B's BLK_N rows from this CTA's TMEM, fp32 into tmem columns
    # [col, col + BLK_N)
    Tx.gemm_async(tmem[:, col:col + BLK_N], Asmem, Bsmem, SFA, SFB, accum=accum,
                  dispatch="tcgen05", cta_group=1)
