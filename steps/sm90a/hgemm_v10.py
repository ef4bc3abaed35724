"""Step 10 (sm_90a): ping-pong consumers, one warpgroup's epilogue under the other's mainloop.

Lesson: the two consumer warpgroups stop sharing a tile: each owns whole output tiles and
they take turns. While one issues the wgmmas of its tile, the other finishes its previous
tile's wgmmas and stores it; two named barriers hand the tensor cores back and forth.
"""
from tvm.script import tirx as T
from tvm.backend.cuda.lang import PipelineState, WarpgroupRole
from tvm.backend.cuda.lang.tile_scheduler import ClusterPersistentScheduler2D

from tirx_gemm import epilogue as E
from tirx_gemm import helpers as H
from tirx_gemm import hopper as W

# tile orders over the grid of cluster tiles (ORDER=)
ORDERS = ("group", "snake")


class SnakeScheduler(ClusterPersistentScheduler2D):
    """v9's L2-grouped order (groups of L2_GROUP cluster-tile rows, walked column by
    column), with every odd group walked from the last column back to the first: the B
    columns the previous group read last are the first ones the next group needs."""

    @T.inline
    def update_current_m_n_idx(self, work_idx):
        LAST_COL = T.meta_var(self._N_TILE_COLS - 1)
        GROUP = T.meta_var(self._l2_group_size)

        @T.inline
        def set_snake(tile_row, tile_col):
            self.m_idx = tile_row
            self.n_idx = T.Select((tile_row // GROUP) % 2 == 1, LAST_COL - tile_col, tile_col)

        self._update_group_major(work_idx, set_snake)


# a named barrier (ids 1..15; 0 is __syncthreads) between two warpgroups: 256 threads
_WAIT_TURN_SRC = """
__device__ __forceinline__ void tirx_gemm_turn_wait(int id) {
  asm volatile("bar.sync %0, 256;" :: "r"(id) : "memory");
}
"""
_GIVE_TURN_SRC = """
__device__ __forceinline__ void tirx_gemm_turn_give(int id) {
  asm volatile("bar.arrive %0, 256;" :: "r"(id) : "memory");
}
"""


@T.inline
def wait_turn(bar_id):
    # all 128 threads of the waiting warpgroup: blocks until the other warpgroup's 128
    # threads have arrived (bar.sync id, 256)
    T.cuda.func_call("tirx_gemm_turn_wait", bar_id, source_code=_WAIT_TURN_SRC)


@T.inline
def give_turn(bar_id):
    # all 128 threads of the giving warpgroup: arrive without waiting (bar.arrive id, 256)
    T.cuda.func_call("tirx_gemm_turn_give", bar_id, source_code=_GIVE_TURN_SRC)


@T.inline
def skip_stages(ring, n: int):
    # move a PipelineState n stages on without waiting (the other warpgroup's tile)
    pos = T.meta_var(ring.stage + n)
    ring.phase = ring.phase ^ ((pos // ring.depth) % 2)
    ring.stage = pos % ring.depth


def hgemm_v10(M: int, N: int, K: int, dtype: str = "float16", PIPE_DEPTH: int = 6,
              BLK_M: int = 128, EPI_BUFS: int = 2, SM_COUNT: int = 132, L2_GROUP: int = 8,
              ORDER: str = "group", PRODUCER_REGS: int = 40, CONSUMER_REGS: int = 232,
              RUNTIME_M: bool = False, BIAS=False, ACT=None):
    """Step card -- v10, ping-pong consumers.

    Changes from v9: each consumer warpgroup owns whole tiles of BLK_M x BLK_N (128x128 by
      default: two m64n128 wgmmas per k16 slice); the CTA's tiles alternate (even to
      warpgroup 0, odd to warpgroup 1) and the two take turns on the tensor cores:
      * warpgroup w waits for its turn (TURN + w), issues its tile's whole mainloop, gives
        the turn to the other (bar.arrive on TURN + 1 - w, only if that one has a tile), and
        only then drains its wgmmas and stores the tile (v9's stmatrix + TMA store);
      * the producer loads tiles in the order they are taken; a stage is one tile's A and B
        slice, 32 KiB instead of 48 KiB: PIPE_DEPTH 6;
      * ORDER="group" (v9's L2 groups) or "snake"; BLK_M=64: a 64x256 tile (40 KiB stages).
      Cluster (2 CTAs, B multicast), producer and epilogue staging: v9's.
    Why: a warpgroup's whole epilogue runs under the other's mainloop instead of one or two
      K steps; half-size tiles pull 50% more L2 bytes per flop (H200 results: the lesson).
    Contracts/Barriers (the lesson's table has counts and phases):
      tma2mma[s]: this CTA's producer (expect_tx, half of B from the peer's multicast)
        -> the 128 threads of the ONE warpgroup that owns the stage's tile.
      mma2tma[s]: threads 0 and 1 of the owning warpgroup, one arrival in each CTA -> each
        CTA's producer, from phase 1.
      TURN + w (ids 3, 4; 256 threads): warpgroup 1 - w bar.arrives once its mainloop is
        issued and the next tile exists; warpgroup w bar.syncs before each of its tiles but
        warpgroup 0's first, so arrivals and waits pair up at any tile count.
      EPI + w (ids 1, 2; 128 threads): v9's staging barrier of warpgroup w.
    Epilogue BIAS and ACT (tirx_gemm/epilogue.py): on each 64-row block right before its
      pack, under the other warpgroup's mainloop (matmul's use of it: the lesson).
    Constraints: any M >= 1; N, K multiples of 8; dtype float16 or bfloat16; BLK_M 128 or
      64; EPI_BUFS dividing BLK_N / 64; PIPE_DEPTH >= 2 stages plus 2 * EPI_BUFS * 8 KiB of
      staging within 227 KiB; SM_COUNT even; ORDER "group" or "snake"; PRODUCER_REGS /
      CONSUMER_REGS multiples of 8 within 64K per CTA; RUNTIME_M as helpers.runtime_rows.
    Run: ``tirx-gemm run v10 --arch sm_90a --mnk 4096,4096,4096``.
    """
    H.check_edge_shape(M, N, K, dtype)
    epi = E.validate({"BIAS": BIAS, "ACT": ACT})
    BIAS_ACT = bool(epi["BIAS"]) or epi["ACT"] is not None
    act_fn, act_src = W._ACT_FN[epi["ACT"]] if epi["ACT"] else (None, None)
    M = H.runtime_rows(M, RUNTIME_M)  # RUNTIME_M: one kernel for every M (A.shape[0])
    if BLK_M not in (64, 128) or isinstance(BLK_M, bool):
        raise ValueError(f"BLK_M={BLK_M!r} must be 128 (128x128 per warpgroup) or 64 "
                         f"(64x256): 128 fp32 accumulators per thread either way")
    BLK_N, BLK_K = 128 * 128 // BLK_M, 64  # per consumer warpgroup (and per CTA ring stage)
    M_BLOCKS = BLK_M // W.WGMMA_M          # m64 wgmmas per k16 slice (2 or 1)
    NUM_CONSUMERS = 2                      # ping-pong: they alternate over whole tiles
    PRODUCER = NUM_CONSUMERS               # the producer is the last warpgroup
    ACC_REGS = M_BLOCKS * BLK_N // 2       # fp32 accumulators per consumer thread (128)
    PACKED_REGS = BLK_N // 4               # 2 x 16-bit registers of one packed 64-row block
    A_STAGE_BYTES = W.tile_bytes(BLK_M, BLK_K)  # 16 KiB (8 KiB for 64x256)
    B_STAGE_BYTES = W.tile_bytes(BLK_N, BLK_K)  # 16 KiB (32 KiB): half loaded by the peer
    B_HALF = BLK_N // W.CLUSTER_SIZE
    EPI_CHUNKS = BLK_N // W.EPI_COLS       # 64-column TMA-store chunks per 64-row block
    EPI_BAR, TURN_BAR = 1, 3               # named barrier ids: + consumer index

    H.check_positive_ints(EPI_BUFS=EPI_BUFS)
    if EPI_CHUNKS % EPI_BUFS:
        raise ValueError(f"EPI_BUFS={EPI_BUFS} does not divide the {EPI_CHUNKS} 64-column "
                         f"chunks of a {BLK_N}-column block: the staging tiles must be "
                         f"used round-robin across blocks and tiles")
    W.check_ring_for_wait_one(PIPE_DEPTH)
    H.check_pipe_depth(PIPE_DEPTH, A_STAGE_BYTES + B_STAGE_BYTES,
                       NUM_CONSUMERS * EPI_BUFS * W.tile_bytes(W.WGMMA_M, W.EPI_COLS))
    H.check_positive_ints(SM_COUNT=SM_COUNT, L2_GROUP=L2_GROUP)
    W.check_cluster_pool(SM_COUNT)
    if ORDER not in ORDERS:
        raise ValueError(f"ORDER={ORDER!r} is not a tile order: choose one of "
                         f"{', '.join(ORDERS)}")
    W.check_reg_split(PRODUCER_REGS, CONSUMER_REGS, NUM_CONSUMERS)
    K_TILES = H.ceil_div(K, BLK_K)
    NUM_CLUSTERS = SM_COUNT // W.CLUSTER_SIZE
    Scheduler = SnakeScheduler if ORDER == "snake" else ClusterPersistentScheduler2D
    pack_fn, pack_src = W._PACK_FN[dtype]  # pack_fragment's conversion, one block at a time

    A_layout = H.swizzled_layout((PIPE_DEPTH, BLK_M, BLK_K), dtype)
    B_layout = H.swizzled_layout((PIPE_DEPTH, BLK_N, BLK_K), dtype)
    D_layout = H.swizzled_layout((NUM_CONSUMERS, EPI_BUFS, W.WGMMA_M, W.EPI_COLS), dtype)

    # the kernel body; bias is None without BIAS (no bias operand)
    @T.inline
    def gemm(A, B, D, bias):
        T.device_entry()
        bx = T.cta_id([SM_COUNT])
        rank, _unused = T.cta_id_in_cluster([W.CLUSTER_SIZE, 1])  # this CTA's place in the pair
        wg_id = T.warpgroup_id([NUM_CONSUMERS + 1])  # 0, 1: consumers; 2: producer
        warp_id = T.warp_id_in_wg([4])
        lane_id = T.lane_id([32])

        # --- allocate ---
        pool = T.SMEMPool()
        # tma2mma[s]: this CTA's producer thread arrives once per load into stage s
        #   (expect_tx for A_STAGE + B_STAGE bytes, half of B from the peer's multicast);
        #   the 128 threads of the consumer warpgroup owning that tile wait. Phase 0 first.
        # mma2tma[s]: threads 0, 1 of the owning consumer warpgroup of BOTH CTAs arrive
        #   (CLUSTER_SIZE arrivals, one remote) once its wgmmas have read stage s; this
        #   CTA's producer waits from phase 1 (a fresh barrier: every stage starts empty).
        stages = H.Ring(pool, PIPE_DEPTH, "tma2mma", 1, "mma2tma", W.CLUSTER_SIZE)
        tma2mma, mma2tma = stages.full, stages.empty
        pool.move_base_to(1024)  # swizzled tiles need 1024-byte alignment
        Asmem = pool.alloc((PIPE_DEPTH, BLK_M, BLK_K), dtype, layout=A_layout)
        Bsmem = pool.alloc((PIPE_DEPTH, BLK_N, BLK_K), dtype, layout=B_layout)
        Dstage = pool.alloc((NUM_CONSUMERS, EPI_BUFS, W.WGMMA_M, W.EPI_COLS), dtype,
                            layout=D_layout)
        pool.commit()

        tid_in_wg = T.meta_var(warp_id * 32 + lane_id)
        if wg_id == PRODUCER:
            if tid_in_wg == 0:
                stages.init()
        W.publish_setup_cluster()

        scheduler = Scheduler(
            "ts", num_m_tiles=H.ceil_div(M, W.CLUSTER_SIZE * BLK_M),
            num_n_tiles=H.ceil_div(N, BLK_N), num_clusters=NUM_CLUSTERS,
            l2_group_size=L2_GROUP)
        scheduler.init(bx // W.CLUSTER_SIZE)

        with WarpgroupRole(wg_id, PRODUCER, regs=PRODUCER_REGS, increase=False):
            # --- load (producer): every tile of this CTA in order, whichever consumer
            # takes it; own A rows, own half of B multicast to both CTAs ---
            if tid_in_wg == 0:
                ring = PipelineState(PIPE_DEPTH, 1)
                while scheduler.valid():
                    m_st = T.meta_var((scheduler.m_idx * W.CLUSTER_SIZE + rank) * BLK_M)
                    n_st = T.meta_var(scheduler.n_idx * BLK_N)
                    for k in T.serial(K_TILES, annotations=H.ROLLED):
                        mma2tma.wait(ring.stage, ring.phase, "producer")
                        W.tma_load_multicast_b(Asmem[ring.stage, :, :],
                                               Bsmem[ring.stage, rank * B_HALF:(rank + 1) * B_HALF, :],
                                               A, B, m_st, n_st + rank * B_HALF, k * BLK_K,
                                               BLK_M, B_HALF, BLK_K, BLK_N,
                                               tma2mma.ptr(ring.stage))
                        ring.advance()
                    scheduler.next_tile()

        with WarpgroupRole(wg_id < NUM_CONSUMERS, True, regs=CONSUMER_REGS, increase=True):
            consumer = T.meta_var(wg_id)  # takes this CTA's tiles consumer, consumer + 2, ...
            acc = T.alloc_local((ACC_REGS,), H.ACC_DTYPE)
            packed = T.alloc_local((PACKED_REGS,), "uint32")  # one 64-row block, 2 x 16-bit
            desc_a = T.alloc_local((1,), "uint64")
            desc_b = T.alloc_local((1,), "uint64")
            W.encode_desc(desc_a, Asmem.ptr_to([0, 0, 0]))
            W.encode_desc(desc_b, Bsmem.ptr_to([0, 0, 0]))
            ring = PipelineState(PIPE_DEPTH, 0)
            held: T.int32 = 0       # stage of the slice whose wgmmas may still be running
            my_turn: T.int32 = 1 - consumer  # warpgroup 0 starts with the turn
            tile_m: T.int32 = 0     # where the current tile goes (the scheduler moves on
            tile_n: T.int32 = 0     # before its epilogue)
            if consumer == 1:       # the first tile is warpgroup 0's
                skip_stages(ring, K_TILES)
                scheduler.next_tile()
            while scheduler.valid():
                tile_m = (scheduler.m_idx * W.CLUSTER_SIZE + rank) * BLK_M
                tile_n = scheduler.n_idx * BLK_N
                if my_turn == 0:
                    wait_turn(TURN_BAR + consumer)  # the other one's mainloop is issued
                my_turn = 0
                for k in T.serial(K_TILES, annotations=H.ROLLED):
                    tma2mma.wait(ring.stage, ring.phase, "consumer")
                    # --- compute: 4 k16 slices of M_BLOCKS x m64nBLK_N; k=0 overwrites ---
                    W.mma_fence()
                    W.wgmma_tile(acc, W.desc_advance(desc_a[0], ring.stage * A_STAGE_BYTES),
                                 W.desc_advance(desc_b[0], ring.stage * B_STAGE_BYTES),
                                 k > 0, M_BLOCKS, BLK_N, dtype)
                    W.mma_commit()
                    # slice k-1 is done: its stage goes back to the producers of both CTAs
                    W.mma_wait(1)
                    if k > 0:
                        W.release_stage_in_cluster(mma2tma, held, tid_in_wg)
                    held = ring.stage
                    ring.advance()
                # the mainloop is issued: the tensor cores go to the other warpgroup,
                # which takes the CTA's next tile (if there is one)
                scheduler.next_tile()
                if scheduler.valid():
                    give_turn(TURN_BAR + 1 - consumer)
                W.mma_wait(0)  # the tile's last slice is done too
                W.release_stage_in_cluster(mma2tma, held, tid_in_wg)
                W.fence_operands(acc, ACC_REGS)  # acc reads below are ordered after the wait
                # --- writeback, under the other warpgroup's mainloop: each 64-row block
                # packed to 2 x dtype, stmatrix'd and TMA-stored in 64-column chunks ---
                for h in T.unroll(M_BLOCKS):
                    if BIAS_ACT:
                        # --- the fused epilogue on this block's fp32 accumulators:
                        # acc[h*BLK_N/2 + 4j + 2r + e] is column tile_n + 8j + 2(l%4) + e ---
                        for j in T.unroll(BLK_N // 8):
                            for e in T.unroll(2):
                                col = T.meta_var(tile_n + 8 * j + 2 * (lane_id % 4) + e)
                                b: T.float32 = T.float32(0)
                                if bias is not None:
                                    b = T.if_then_else(col < N, T.Cast("float32", bias[col]),
                                                       T.float32(0))
                                for r in T.unroll(2):
                                    x = T.meta_var(acc[h * (BLK_N // 2) + 4 * j + 2 * r + e]
                                                   + b)
                                    if act_fn is not None:
                                        acc[h * (BLK_N // 2) + 4 * j + 2 * r + e] = \
                                            T.cuda.func_call(act_fn, x, source_code=act_src,
                                                             return_type="float32")
                                    else:
                                        acc[h * (BLK_N // 2) + 4 * j + 2 * r + e] = x
                    for i in T.unroll(PACKED_REGS):
                        packed[i] = T.cuda.func_call(
                            pack_fn, acc[h * (BLK_N // 2) + 2 * i],
                            acc[h * (BLK_N // 2) + 2 * i + 1], source_code=pack_src,
                            return_type="uint32")
                    W.store_packed_tile(D, Dstage, consumer, packed, tile_m + h * W.WGMMA_M,
                                        tile_n, BLK_N, EPI_BUFS, warp_id, lane_id, tid_in_wg,
                                        EPI_BAR + consumer)
                # the other warpgroup's tile: its stages are not ours to wait on
                skip_stages(ring, K_TILES)
                scheduler.next_tile()
            if tid_in_wg == 0:
                H.store_wait(0)  # every store has completed

        # --- free: the peer multicasts into this CTA's SMEM and arrives on its barriers
        # until it is done; neither CTA may exit (and release its SMEM) before both are ---
        T.cuda.cluster_sync()

    if BIAS:
        @T.prim_func
        def kernel(A: T.Buffer((M, K), dtype), B: T.Buffer((N, K), dtype),
                   D: T.Buffer((M, N), dtype), bias: T.Buffer((N,), BIAS)):
            gemm(A, B, D, bias)
    else:
        @T.prim_func
        def kernel(A: T.Buffer((M, K), dtype), B: T.Buffer((N, K), dtype),
                   D: T.Buffer((M, N), dtype)):
            gemm(A, B, D, None)

    return kernel
