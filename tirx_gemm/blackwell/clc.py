"""v10's Cluster Launch Control: the try_cancel request and ClusterLaunchControl, the dynamic tile scheduler."""

from __future__ import annotations

from tvm.backend.cuda.lang import PipelineState
from tvm.backend.cuda.lang.clc import query_cancel_first_ctaid_x
from tvm.script import tirx as T

from .. import helpers as H
from .cluster import CTA_PAIR


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
