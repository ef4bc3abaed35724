"""scripts/prune_sim_cache.py: CI's first step frees NumSim's artifact cache when the disk
is short, oldest entries first, and never touches a young entry or anything outside the
two artifact folders."""
import importlib.util
import os
from pathlib import Path

import pytest

_SPEC = importlib.util.spec_from_file_location(
    "prune_sim_cache", Path(__file__).resolve().parents[1] / "scripts" / "prune_sim_cache.py")
prune_sim_cache = importlib.util.module_from_spec(_SPEC)
_SPEC.loader.exec_module(prune_sim_cache)


def _entry(folder: Path, name: str, size: int, mtime: float) -> Path:
    path = folder / name
    path.mkdir(parents=True)
    (path / "kernel.so").write_bytes(b"x" * size)
    os.utime(path, (mtime, mtime))
    return path


def _disk(tree: Path, capacity: int):
    """A fake disk of ``capacity`` bytes holding exactly what is under ``tree``."""
    def free() -> int:
        used = sum(f.stat().st_size for f in tree.rglob("*") if f.is_file())
        return capacity - used
    return free


def test_roots_follow_numsim_environment(tmp_path):
    root, build = prune_sim_cache.cache_roots({"XDG_CACHE_HOME": str(tmp_path)})
    assert root == tmp_path / "tirx-numsim" and build == tmp_path / "tirx-numsim" / "build"
    root, build = prune_sim_cache.cache_roots(
        {"NUMSIM_CACHE_DIR": str(tmp_path / "a"), "NUMSIM_BUILD_CACHE_DIR": str(tmp_path / "b")})
    assert (root, build) == (tmp_path / "a", tmp_path / "b")


def test_removes_oldest_until_enough_is_free(tmp_path):
    root, build = tmp_path / "c", tmp_path / "c" / "build"
    now = 1_000_000.0
    old = [_entry(root / "artifacts", f"old{i}", 100, now - 10_000 + i) for i in range(3)]
    older_build = _entry(build / "artifacts", "oldest", 100, now - 20_000)
    young = _entry(root / "artifacts", "young", 100, now - 10)
    engine = build / "engines" / "engine.so"
    engine.parent.mkdir(parents=True)
    engine.write_bytes(b"e" * 100)
    # 600 bytes used of 750: 150 free; 320 needed, so the two oldest entries go
    done = prune_sim_cache.prune(root, build, min_free=320, keep_s=3600,
                                 free=_disk(tmp_path, 750), now=now)
    assert done["removed"] == 2 and done["freed"] == 200 and done["free_after"] == 350
    assert not older_build.exists() and not old[0].exists()
    assert old[1].exists() and old[2].exists() and young.exists() and engine.exists()


def test_young_entries_and_enough_space_are_left_alone(tmp_path):
    root, build = tmp_path / "c", tmp_path / "c" / "build"
    now = 1_000_000.0
    young = _entry(root / "artifacts", "young", 100, now - 60)
    done = prune_sim_cache.prune(root, build, min_free=10_000, keep_s=3600,
                                 free=_disk(tmp_path, 200), now=now)
    assert done["removed"] == 0 and young.exists()
    old = _entry(root / "artifacts", "old", 100, now - 7200)
    done = prune_sim_cache.prune(root, build, min_free=10, keep_s=3600,
                                 free=_disk(tmp_path, 1000), now=now)
    assert done["removed"] == 0 and old.exists()


def test_cli_reports_and_warns(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("NUMSIM_CACHE_DIR", str(tmp_path / "none"))
    monkeypatch.setenv("NUMSIM_BUILD_CACHE_DIR", str(tmp_path / "none" / "build"))
    assert prune_sim_cache.main(["--min-free", "0.001"]) == 0
    assert "nothing removed" in capsys.readouterr().out
    assert prune_sim_cache.main(["--min-free", "1000000"]) == 0
    assert "No space left on device" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        prune_sim_cache.main(["--min-free", "0"])
