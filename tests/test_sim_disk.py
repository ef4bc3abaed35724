"""NumSim's cache on disk (tirx_gemm/sim/disk.py): CI's first step makes room when the disk is
short and `tirx-gemm sim` keeps the cache under a size, least recently used entries first;
neither touches an entry in use or anything outside the two artifact folders."""
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tirx_gemm.sim import disk

REPO = Path(__file__).resolve().parents[1]
NOW = 1_000_000.0


def _entry(folder: Path, name: str, size: int, used: float) -> Path:
    path = folder / name
    path.mkdir(parents=True)
    (path / "module.so").write_bytes(b"x" * size)
    for p in (path / "module.so", path):
        os.utime(p, (used, used))
    return path


def _disk(tree: Path, capacity: int):
    """A fake disk of ``capacity`` bytes holding exactly what is under ``tree``."""
    def free() -> int:
        return capacity - sum(f.stat().st_size for f in tree.rglob("*") if f.is_file())
    return free


def _cache(tmp_path):
    root, build = tmp_path / "c", tmp_path / "c" / "build"
    old = [_entry(root / "artifacts", f"old{i}", 100, NOW - 10_000 + i) for i in range(3)]
    oldest = _entry(build / "artifacts", "oldest", 100, NOW - 20_000)
    young = _entry(root / "artifacts", "young", 100, NOW - 10)
    engine = build / "engines" / "engine.so"
    engine.parent.mkdir(parents=True)
    engine.write_bytes(b"e" * 100)
    return root, build, old, oldest, young, engine


def test_roots_follow_numsim_environment(tmp_path):
    root, build = disk.cache_roots({"XDG_CACHE_HOME": str(tmp_path)})
    assert root == tmp_path / "tirx-numsim" and build == tmp_path / "tirx-numsim" / "build"
    root, build = disk.cache_roots(
        {"NUMSIM_CACHE_DIR": str(tmp_path / "a"), "NUMSIM_BUILD_CACHE_DIR": str(tmp_path / "b")})
    assert (root, build) == (tmp_path / "a", tmp_path / "b")


def test_last_use_is_the_latest_read_of_any_file(tmp_path):
    tmp_path = tmp_path / "artifacts"
    e = _entry(tmp_path, "e", 10, NOW - 5000)
    os.utime(e / "module.so", (NOW - 1, NOW - 5000))  # read a second ago, written long before
    assert disk.entries(tmp_path / "none", tmp_path / "none") == []
    [(last, size, path)] = disk.entries(tmp_path.parent, tmp_path / "none")
    assert (last, size, path) == (NOW - 1, 10, e)


def test_make_room_removes_least_recently_used_until_enough_is_free(tmp_path):
    root, build, old, oldest, young, engine = _cache(tmp_path)
    # 600 bytes used of 750: 150 free; 320 needed, so the two least recently used go
    done = disk.make_room(root, build, min_free=320, keep_s=3600, free=_disk(tmp_path, 750),
                          now=NOW)
    assert done == {"free_before": 150, "free_after": 350, "removed": 2, "freed": 200}
    assert not oldest.exists() and not old[0].exists()
    assert old[1].exists() and old[2].exists() and young.exists() and engine.exists()


def test_make_room_spares_recent_entries_and_a_roomy_disk(tmp_path):
    root, build, old, oldest, young, engine = _cache(tmp_path)
    done = disk.make_room(root, build, min_free=10_000, keep_s=3600, free=_disk(tmp_path, 1000),
                          now=NOW)
    assert done["removed"] == 4 and young.exists() and engine.exists()
    root2, build2, *kept = _cache(tmp_path / "second")
    done = disk.make_room(root2, build2, min_free=10, keep_s=3600, free=_disk(tmp_path, 10_000),
                          now=NOW)
    assert done["removed"] == 0 and all(p.exists() for p in kept[0] + kept[1:])


def test_cap_keeps_the_cache_under_its_size_and_this_runs_entries(tmp_path):
    root, build, old, oldest, young, engine = _cache(tmp_path)
    done = disk.cap(root, build, max_bytes=250, keep_since=NOW - 100)
    assert done == {"entries": 2, "bytes": 200, "removed": 3, "freed": 300}
    assert old[2].exists() and young.exists() and engine.exists()
    done = disk.cap(root, build, max_bytes=0, keep_since=NOW - 100)  # this run's: kept
    assert done["removed"] == 1 and young.exists() and done["bytes"] == 100


def test_cap_line_says_size_and_what_went(tmp_path):
    root, build, *_ = _cache(tmp_path)
    env = {"NUMSIM_CACHE_DIR": str(root), "NUMSIM_BUILD_CACHE_DIR": str(build)}
    line = disk.cap_line(250 / disk.GIB, keep_since=NOW - 100, env=env)
    assert "in 2 kernel entries" in line and "removed the 3 least recently used" in line
    line = disk.cap_line(1e-9, keep_since=NOW - 100, env=env)
    assert "this run's own entries alone are more" in line


def _script(tmp_path, *args):
    env = dict(os.environ, NUMSIM_CACHE_DIR=str(tmp_path / "none"),
               NUMSIM_BUILD_CACHE_DIR=str(tmp_path / "none" / "build"))
    return subprocess.run([sys.executable, "-S", str(REPO / "scripts" / "prune_sim_cache.py"),
                           *args], capture_output=True, text=True, env=env, cwd=tmp_path)


def test_script_runs_on_the_standard_library_and_warns(tmp_path):
    # -S: no site-packages, as CI's first step runs before any venv exists
    done = _script(tmp_path, "--min-free", "0.001")
    assert done.returncode == 0 and "nothing removed" in done.stdout, done.stderr
    done = _script(tmp_path, "--min-free", "1000000")
    assert done.returncode == 0 and "No space left on device" in done.stderr
    done = _script(tmp_path, "--min-free", "0")
    assert done.returncode == 2 and "--min-free must be > 0" in done.stderr


@pytest.mark.parametrize("bad", ["0", "-1", "inf", "nan"])
def test_sim_refuses_a_cache_size_that_is_not_positive(bad, capsys):
    from tirx_gemm.cli import main
    rc = main(["sim", "v4", "--cache-max-gib", bad])
    assert rc != 0 and "--cache-max-gib" in capsys.readouterr().err
