"""Programmatic dependent launch (PDL): a kernel that starts before the one ahead of it ends.

Two kernels queued on one stream normally run strictly one after the other: the second
grid is launched only once the first has finished and flushed, so every call pays the
launch latency and its own prologue (shared-memory carve-out, barrier init, descriptor
prefetch) with the GPU idle. With PDL (sm_90 on) the second kernel is launched with
``cudaLaunchAttributeProgrammaticStreamSerialization``: its CTAs may start as soon as the
first grid's CTAs have all exited or executed ``griddepcontrol.launch_dependents``, and
the second kernel itself says where it starts depending on the first one's memory:
``griddepcontrol.wait`` blocks the thread until every prerequisite grid has completed and
its writes are visible. Everything before the wait overlaps the previous kernel's tail.

The contract a kernel keeps here: every thread executes :func:`wait` after its prologue
(barrier init, TMEM/TMA set-up: nothing that reads or writes global memory) and before its
first global access (TMA loads of A and B, stores of D, workspace counters), so no read of
an operand still being written and no write of D still being read can happen. It then
calls :func:`launch_dependents`, letting the next kernel's CTAs launch while this one
works: they can only take an SM this grid has left (a persistent CTA fills one), and they
wait in their own :func:`wait` until this grid is done.

TVM 0.27 sets the launch attribute for a PrimFunc whose ``tirx.kernel_launch_params`` list
``tirx.use_programtic_dependent_launch`` (TVM's spelling); its CUDA runtime launches a
kernel with cluster dimensions OR with PDL, never both, so only one-CTA (no cluster)
kernels take it (:func:`with_launch`). A kernel launched without the attribute runs its
``griddepcontrol.wait`` as a no-op.
"""
from __future__ import annotations

PDL_TAG = "tirx.use_programtic_dependent_launch"  # sic: TVM 0.27's attribute name
# what TVM derives for a 1-D grid of one-CTA blocks with dynamic shared memory, and where
# the PDL tag goes in it
LAUNCH_PARAMS = ("blockIdx.x", "threadIdx.x", PDL_TAG, "tirx.use_dyn_shared_memory")


def check(pdl, cluster: int = 1) -> None:
    """One-line refusals: PDL a bool, and no cluster with it (TVM launches one or the other)."""
    if not isinstance(pdl, bool):
        raise ValueError(f"PDL={pdl!r} must be True or False")
    if pdl and cluster != 1:
        raise ValueError(f"PDL=True with CLUSTER={cluster}: TVM 0.27's CUDA runtime launches "
                         "a kernel with cluster dimensions or with programmatic dependent "
                         "launch, not both; use CLUSTER=1")


def with_launch(func, pdl: bool):
    """``func`` (a PrimFunc of a 1-D grid of one-CTA blocks using dynamic shared memory)
    with the PDL launch attribute when ``pdl``; unchanged otherwise."""
    if not pdl:
        return func
    return func.with_attr("tirx.kernel_launch_params", list(LAUNCH_PARAMS))


def wait():
    """griddepcontrol.wait: this thread waits until the grids it depends on are complete
    and their memory visible. Called in a kernel body (emits the instruction)."""
    from tvm.script import tirx as T
    T.evaluate(T.ptx.griddepcontrol.wait())


def launch_dependents():
    """griddepcontrol.launch_dependents: the next PDL kernel on the stream may launch once
    every CTA of this grid has called it (or exited). Called in a kernel body."""
    from tvm.script import tirx as T
    T.evaluate(T.ptx.griddepcontrol.launch_dependents())
