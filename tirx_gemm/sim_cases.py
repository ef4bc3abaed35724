"""The NumSim cases of the sm_100a steps v1-v12, as the registry (tirx_gemm/registry.py)
gives them to each Step's ``sim_cases``: ((M, N, K), builder keywords) per case. Data only;
v13-v15 list theirs in their registry rows. ``tirx-gemm sim`` runs them (tirx_gemm/sim/)."""

# CPU simulation cases of the sm_100a steps (small shapes: NumSim runs on the CPU). Each
# protocol is exercised where it can break: more K tiles than PIPE_DEPTH and fewer, K
# tile counts that are not a multiple of the ring depth, non-square tile grids, persistent
# pools small enough (SM_COUNT) that each CTA walks several tiles and phases wrap across
# tiles, a CTA pool larger than the tile count, and v7 with a one-stage ring.
SIM_CASES = {
    "v1": (((128, 128, 64), ()),),
    "v2": (((128, 128, 64), ()), ((128, 128, 320), ())),
    "v3": (((256, 384, 128), ()),),
    "v4": (((256, 128, 192), ()), ((128, 256, 64), ()), ((200, 136, 200), ())),
    "v5": (((256, 128, 384), ()), ((128, 256, 64), ()), ((128, 128, 192), (("PIPE_DEPTH", 4),)),
           ((136, 264, 264), ())),
    "v6": (((384, 256, 320), (("SM_COUNT", 2),)), ((256, 384, 64), (("SM_COUNT", 4),)),
           ((256, 256, 256), (("SM_COUNT", 1), ("PIPE_DEPTH", 3))),
           ((300, 136, 200), (("SM_COUNT", 2),))),
    "v7": (((384, 256, 320), (("SM_COUNT", 2),)), ((256, 384, 128), (("SM_COUNT", 2),)),
           ((256, 256, 192), (("SM_COUNT", 1), ("PIPE_DEPTH", 1))),
           ((128, 256, 128), (("SM_COUNT", 4),)), ((300, 136, 200), (("SM_COUNT", 2),))),
    # v8/v9: cluster tiles (256x256, 512x256) over SM_COUNT // 2 CTA pairs
    "v8": (((512, 768, 320), (("SM_COUNT", 2),)), ((768, 512, 128), (("SM_COUNT", 4),)),
           ((512, 256, 448), (("SM_COUNT", 2), ("PIPE_DEPTH", 3))),
           ((256, 256, 192), (("SM_COUNT", 4), ("PIPE_DEPTH", 1))),
           ((300, 264, 200), (("SM_COUNT", 2),))),
    "v9": (((512, 768, 320), (("SM_COUNT", 2),)), ((1536, 256, 128), (("SM_COUNT", 4),)),
           ((512, 512, 448), (("SM_COUNT", 2), ("PIPE_DEPTH", 3))),
           ((512, 256, 192), (("SM_COUNT", 4), ("PIPE_DEPTH", 1))),
           ((600, 264, 200), (("SM_COUNT", 2),)),
           # M at run time (matmul's v9 on sm_100a): one PrimFunc, A of M=300 rows
           ((300, 264, 136), (("RUNTIME_M", True), ("SM_COUNT", 2)))),
    # v10 (CLC): one cluster per 256x256 tile. The gate executes the whole launch, so
    # every cluster is resident and each CLC request fails (one tile per cluster); the
    # builder's tirx_gemm.resident_clusters (SM_COUNT // 2) names the subset a run keeps
    # resident for the cancel path. Cases: 6 tiles for 2 pairs, 2 K tiles < PIPE_DEPTH;
    # CLC=False (v8's stride, the double-buffered accumulator walked 6 tiles by one
    # pair: phases wrap); more pairs than tiles with a one-stage ring; an edge case
    "v10": (((768, 512, 128), (("SM_COUNT", 4),)),
            ((512, 768, 320), (("SM_COUNT", 2), ("CLC", False))),
            ((256, 256, 192), (("SM_COUNT", 4), ("PIPE_DEPTH", 1))),
            ((300, 264, 200), (("SM_COUNT", 2),))),
    # v11: SPLIT_K not dividing the K tiles (10 = 3 + 3 + 4) with a CTA per unit; more
    # units than CTAs (each CTA walks several, some reduce, some only publish) with a
    # 2-stage ring; an edge case (M, N off the tile grid, a partial last K tile);
    # SPLIT_K=1 (v7's data-parallel path, no workspace)
    "v11": (((256, 256, 640), (("SM_COUNT", 12), ("SPLIT_K", 3))),
            ((256, 128, 512), (("SM_COUNT", 3), ("SPLIT_K", 4), ("PIPE_DEPTH", 2))),
            ((200, 136, 200), (("SM_COUNT", 8), ("SPLIT_K", 2))),
            ((256, 256, 192), (("SM_COUNT", 2), ("SPLIT_K", 1))),
            # REDUCE="spread" (every split reduces a band after waiting for all):
            # tiles x SPLIT_K == SM_COUNT with SPLIT_K not dividing the K tiles (4 x 3 = 12,
            # 10 K tiles); SPLIT_K dividing them with idle SMs (2 x 4 < 10, 8 K tiles) and
            # 4 slabs per load group; an edge case; bf16
            ((256, 256, 640), (("SM_COUNT", 12), ("SPLIT_K", 3), ("REDUCE", "spread"))),
            ((256, 128, 512), (("SM_COUNT", 10), ("SPLIT_K", 4), ("REDUCE", "spread"))),
            ((200, 136, 200), (("SM_COUNT", 8), ("SPLIT_K", 2), ("REDUCE", "spread"))),
            ((256, 256, 640), (("SM_COUNT", 12), ("SPLIT_K", 3), ("REDUCE", "spread"),
                               ("dtype", "bfloat16"))),
            # RUNTIME_M (matmul's runtime-M kernel): M, the tile count and the
            # workspace extents bound at the call; 18 units on 12 CTAs ("last"), and the
            # spread reduction with every unit resident (4 edge tiles x 2 = 8 CTAs)
            ((300, 136, 640), (("RUNTIME_M", True), ("SM_COUNT", 12), ("SPLIT_K", 3))),
            ((200, 136, 512), (("RUNTIME_M", True), ("SM_COUNT", 8), ("SPLIT_K", 2),
                               ("REDUCE", "spread")))),
    # v12 (tile menu): BLK_N 256 (4 tiles on 2 CTAs, 5 K tiles over the 4-stage ring the
    # default fits); BLK_N 176 (two 64-column chunks by TMA store and a 48-column tail,
    # guarded) with M, N off the tile grid, the tail of the last N tile half past N, a
    # partial last K tile and a 2-stage ring; RUNTIME_M with BLK_N 48 (the tail only) and
    # more CTAs than some walk (6 tiles on 4); SWAP_AB (the MMA's rows walk N, its 16..
    # columns the tokens, D stored transposed): 40 tokens in token tiles of 16 (the last
    # half past M) by 3 row tiles, the last 72 of 128 rows inside N, 9 tiles on 2 CTAs; one
    # token at RUNTIME_M in a 48-column tile (three 16-column reads), 2 tiles on 4 CTAs;
    # 72 tokens in 64-column tiles (one 64-column read) on a 2-stage ring, 4 tiles on 2 CTAs
    "v12": (((256, 512, 320), (("SM_COUNT", 2), ("BLK_N", 256))),
            ((300, 328, 200), (("SM_COUNT", 2), ("BLK_N", 176), ("PIPE_DEPTH", 2))),
            ((200, 136, 128), (("RUNTIME_M", True), ("SM_COUNT", 4), ("BLK_N", 48))),
            ((40, 328, 200), (("SM_COUNT", 2), ("BLK_N", 16), ("SWAP_AB", True))),
            ((1, 200, 136), (("RUNTIME_M", True), ("SM_COUNT", 4), ("BLK_N", 48),
                             ("SWAP_AB", True))),
            ((72, 256, 192), (("SM_COUNT", 2), ("BLK_N", 64), ("SWAP_AB", True),
                              ("PIPE_DEPTH", 2))),
            # STREAM_K (tirx_gemm/streamk.py): 11 tiles on 8 CTAs, the tail wave 3 of 8 (just
            # under half): 8 data-parallel tiles, then 3 x 20 K steps (the last partial) on
            # 7 units, 3 pieces a tile, units 2 and 4 on two tiles, CTA 7 with no unit, the
            # 32 columns stored as two guarded tails; 12 tiles on 8 (the tail at half: plan
            # off, v12's walk); RUNTIME_M (the plan on the device): 9 edge tiles on 4 CTAs,
            # the last (past M and N) in 2 pieces reduced into a clipped 64-column TMA store
            ((128, 352, 1256), (("SM_COUNT", 8), ("BLK_N", 32), ("STREAM_K", True))),
            ((128, 192, 1024), (("SM_COUNT", 8), ("BLK_N", 16), ("STREAM_K", True))),
            ((300, 136, 1032), (("RUNTIME_M", True), ("SM_COUNT", 4), ("BLK_N", 64),
                                ("STREAM_K", True)))),
}
# every step is also simulated once in bf16 (its first case); the edge cases above (v4 on:
# M not a multiple of the tile, N and K multiples of 8 only) exercise TMA's zero-filled
# loads and clipped stores, partial cluster tiles and ceil-divided tile counts
BF16 = (("dtype", "bfloat16"),)
SIM_CASES = {k: v + ((v[0][0], v[0][1] + BF16),) for k, v in SIM_CASES.items()}
# v9's fused epilogue (tirx_gemm.epilogue), one CTA pair: each activation once,
# each bias dtype once, an fp32 output, SwiGLU in both dtypes (the bf16 one with an fp32
# output, a tile half past the fused weight's 2N rows), M and N off the tile grid in most
_EPI = (("SM_COUNT", 2),)
SIM_CASES["v9"] += (
    ((300, 264, 136), _EPI + (("BIAS", "float32"), ("ACT", "gelu"))),
    ((300, 136, 128), _EPI + (("BIAS", "float16"), ("ACT", "gelu_tanh"))),
    ((512, 256, 128), _EPI + (("BIAS", "bfloat16"), ("ACT", "silu")) + BF16),
    ((256, 200, 128), _EPI + (("ACT", "relu"), ("OUT_DTYPE", "float32"))),
    ((300, 136, 128), _EPI + (("SWIGLU", True),)),
    ((200, 64, 128), _EPI + (("SWIGLU", True), ("OUT_DTYPE", "float32")) + BF16),
)
