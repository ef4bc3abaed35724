import os
import tempfile

import pytest


@pytest.fixture(scope="session", autouse=True)
def _isolated_build_cache():
    """Tests build from scratch into their own cache, never reusing a developer's builds."""
    if os.environ.get("TIRX_GEMM_TEST_CACHE"):
        os.environ["TIRX_GEMM_CACHE"] = os.environ["TIRX_GEMM_TEST_CACHE"]
        yield
        return
    with tempfile.TemporaryDirectory(prefix="tirx-gemm-test-cache.") as d:
        old = os.environ.get("TIRX_GEMM_CACHE")
        os.environ["TIRX_GEMM_CACHE"] = d
        yield
        if old is None:
            os.environ.pop("TIRX_GEMM_CACHE", None)
        else:
            os.environ["TIRX_GEMM_CACHE"] = old
