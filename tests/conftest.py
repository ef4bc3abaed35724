import os
import tempfile
import time
from pathlib import Path

import pytest

# The tests' own build cache: never a developer's (~/.cache/tirx-gemm), but kept between
# runs, so a second run reuses what the first built. An entry is keyed by the step's source,
# the shared modules, build.py and the toolchain (build.cache_key), so a changed source is
# rebuilt, never served stale. TIRX_GEMM_TEST_CACHE moves it; TIRX_GEMM_TEST_FRESH=1 builds
# everything from scratch in a temporary folder (a clean clone, as CI has, starts empty).
DEFAULT_TEST_CACHE = Path(__file__).resolve().parent.parent / "build" / "test-cache"


@pytest.fixture(scope="session", autouse=True)
def _isolated_build_cache():
    old = os.environ.get("TIRX_GEMM_CACHE")
    if os.environ.get("TIRX_GEMM_TEST_FRESH") == "1":
        with tempfile.TemporaryDirectory(prefix="tirx-gemm-test-cache.") as d:
            os.environ["TIRX_GEMM_CACHE"] = d
            yield
    else:
        cache = Path(os.environ.get("TIRX_GEMM_TEST_CACHE") or DEFAULT_TEST_CACHE)
        cache.mkdir(parents=True, exist_ok=True)
        os.environ["TIRX_GEMM_CACHE"] = str(cache)
        yield
    if old is None:
        os.environ.pop("TIRX_GEMM_CACHE", None)
    else:
        os.environ["TIRX_GEMM_CACHE"] = old


@pytest.fixture
def soon():
    """soon(done, within_s=15.0): True once done() is, polled every 50 ms; False after
    within_s (kills, parent-death signals and lock releases are asynchronous)."""
    def wait(done, within_s: float = 15.0) -> bool:
        deadline = time.monotonic() + within_s
        while not done():
            if time.monotonic() > deadline:
                return False
            time.sleep(0.05)
        return True
    return wait
