"""The build pool's fork server starts here: it is the first module of pool.POOL_PRELOAD, and
multiprocessing's fork server can only import modules, not call a function, before it
imports TVM. So this module is an entry point, like a ``__main__.py``: imported by that fork
server it calls :func:`tirx_gemm.compile.pool.prepare_fork_server`; imported anywhere else it does
nothing.
"""

import sys


def _imported_by_fork_server() -> bool:
    """Whether multiprocessing.forkserver.main is importing this module (its preload)."""
    frame = sys._getframe(1)
    while frame is not None:
        if (frame.f_code.co_name == "main"
                and frame.f_globals.get("__name__") == "multiprocessing.forkserver"):
            return True
        frame = frame.f_back
    return False


if _imported_by_fork_server():
    from tirx_gemm.compile.pool import prepare_fork_server

    prepare_fork_server()
