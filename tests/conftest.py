import importlib.util
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path

import pytest

from tirx_gemm import settings

# The tests' own build cache: never a developer's (~/.cache/tirx-gemm), but kept between
# runs, so a second run reuses what the first built. An entry is keyed by the step's source,
# the shared modules, the build modules and the toolchain (cache.cache_key), so a changed
# source is rebuilt, never served stale. TIRX_GEMM_TEST_CACHE moves it; TIRX_GEMM_TEST_FRESH=1
# builds everything from scratch in a temporary folder (a clean clone, as CI has, starts
# empty). The folder is chosen once, in the process pytest was started in, and handed to
# pytest-xdist's workers through _SESSION_CACHE_ENV, so every worker uses the same one.
TESTS = Path(__file__).resolve().parent
DEFAULT_TEST_CACHE = TESTS.parent / "build" / "test-cache"
_SESSION_CACHE_ENV = "_TIRX_GEMM_SESSION_TEST_CACHE"
_fresh_dir: str | None = None


def _session_cache() -> str:
    global _fresh_dir
    inherited = os.environ.get(_SESSION_CACHE_ENV)
    if inherited:  # an xdist worker: the folder its controller chose
        return inherited
    if settings.get("TIRX_GEMM_TEST_FRESH"):
        _fresh_dir = tempfile.mkdtemp(prefix="tirx-gemm-test-cache.")
        cache = _fresh_dir
    else:
        cache = str(settings.get("TIRX_GEMM_TEST_CACHE", default=DEFAULT_TEST_CACHE))
        Path(cache).mkdir(parents=True, exist_ok=True)
    os.environ[_SESSION_CACHE_ENV] = cache
    return cache


def pytest_configure(config):
    config._tirx_gemm_old_cache = os.environ.get("TIRX_GEMM_CACHE")
    os.environ["TIRX_GEMM_CACHE"] = _session_cache()


def pytest_unconfigure(config):
    old = getattr(config, "_tirx_gemm_old_cache", None)
    if old is None:
        os.environ.pop("TIRX_GEMM_CACHE", None)
    else:
        os.environ["TIRX_GEMM_CACHE"] = old
    if _fresh_dir and not hasattr(config, "workerinput"):
        shutil.rmtree(_fresh_dir, ignore_errors=True)
        os.environ.pop(_SESSION_CACHE_ENV, None)


def _runs_test_build(config) -> bool:
    """True when this run collects tests/test_build.py (the whole suite, the tests folder or
    that file), whose batch the rest of the suite reuses."""
    if config.option.collectonly or hasattr(config, "workerinput"):
        return False
    args = [a.split("::")[0] for a in config.args] or [str(TESTS)]
    for a in args:
        p = Path(a).resolve()
        if p == TESTS or p == TESTS.parent or p == TESTS / "test_build.py":
            return True
    return False


def _setup_requests():
    """tests/test_build.py's REQUESTS: the one home of what the suite builds up front (its
    INVALID shape stays in that file's own batch: a refusal, not a build)."""
    spec = importlib.util.spec_from_file_location("test_build", TESTS / "test_build.py")
    mod = sys.modules.get("test_build")
    if mod is None:
        mod = importlib.util.module_from_spec(spec)
        sys.modules["test_build"] = mod
        spec.loader.exec_module(mod)
    return list(mod.REQUESTS)


_collecting: dict = {"progress": None}


def _start_collection_heartbeat(config) -> None:
    """From the session's start to its first test result, pytest prints nothing while the
    tests are collected (each xdist worker imports torch and TVM: ~30 s on 2 cores): a
    heartbeat line says so every 10 s. Stopped by the first result."""
    if hasattr(config, "workerinput") or config.option.collectonly:
        return
    from tirx_gemm.progress import Progress
    prog = Progress("tests: collecting (importing torch and TVM) before the first result",
                    stream=sys.stderr)
    prog.__enter__()
    _collecting["progress"] = prog


def pytest_runtest_logreport(report):
    prog = _collecting["progress"]
    if prog is not None:
        _collecting["progress"] = None
        prog.__exit__(None, None, None)


def pytest_sessionfinish(session):
    pytest_runtest_logreport(None)  # no test ran at all: stop the heartbeat too


@pytest.hookimpl(tryfirst=True)
def pytest_sessionstart(session):
    _setup_builds(session)
    _start_collection_heartbeat(session.config)


def _setup_builds(session):
    """The suite's set-up, before pytest-xdist starts its workers: every build the tests use,
    in one parallel batch, with a line per build and a heartbeat at least every 10 s (the
    workers' own output is captured, so a batch built there would be silent for minutes)."""
    config = session.config
    if not _runs_test_build(config):
        return
    from tirx_gemm.compile.api import build_many
    from tirx_gemm.progress import Progress
    reqs = _setup_requests()
    cache = os.environ["TIRX_GEMM_CACHE"]
    print(f"\ntest set-up: {len(reqs)} builds of every step (both arches) into {cache}; "
          "cached ones are read back, the rest compile in parallel (minutes from an empty "
          "cache)", file=sys.stderr, flush=True)
    cached = []

    def line(done, total, req, res):  # a line per build; cache hits are counted, not listed
        if getattr(res, "cached", False):
            cached.append(req)
            prog.done += 1
        else:
            prog.build_done(req, res)

    with Progress("test set-up: building", len(reqs), stream=sys.stderr) as prog:
        build_many(reqs, progress=line)
    print(f"test set-up: done in {prog.elapsed():.0f} s ({len(reqs) - len(cached)} built, "
          f"{len(cached)} read from the cache); the tests start now", file=sys.stderr,
          flush=True)


@pytest.fixture
def cache(tmp_path, monkeypatch):
    """An empty build cache of this test's own (TIRX_GEMM_CACHE points at it)."""
    d = tmp_path / "cache"
    monkeypatch.setenv("TIRX_GEMM_CACHE", str(d))
    return d


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
