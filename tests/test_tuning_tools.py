"""The H200 tuning tools' host-side logic: clock_probe's reading of nvidia-smi samples and
the Hopper register-split check behind v9's PRODUCER_REGS/CONSUMER_REGS."""
import importlib.util
from pathlib import Path

import pytest

from tirx_gemm import hopper as W

ROOT = Path(__file__).resolve().parent.parent


def _load_script(name):
    spec = importlib.util.spec_from_file_location(name, ROOT / "lab" / "steps_on_h200" / f"{name}.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_clock_probe_summarizes_samples_and_names_the_power_cap():
    probe = _load_script("clock_probe")
    rows = [["1500", "1980", "690.5", "700.00", "62", "0x0000000000000004"],
            ["1530", "1980", "694.0", "700.00", "63", "0x0000000000000000"],
            ["1470", "1980", "[N/A]", "700.00", "63", "0x0000000000000024"]]
    s = probe.summarize(rows)
    assert s["samples"] == 3
    assert s["sm_mhz"] == 1500 and s["max_sm_mhz"] == 1980
    assert s["power_w"] == pytest.approx(692.25)  # the unreadable sample is left out
    assert s["reasons"] == ["sw-power-cap", "sw-thermal"]  # OR of every sample's bits
    assert probe.summarize([])["sm_mhz"] is None


def test_register_split_follows_setmaxnreg_and_the_register_file():
    W.check_reg_split(40, 232, 2)  # v7-v9's split: 128*40 + 256*232 = 64512
    W.check_reg_split(24, 240, 2)  # fast.cu's
    with pytest.raises(ValueError, match="66560 registers per CTA"):
        W.check_reg_split(24, 248, 2)
    with pytest.raises(ValueError, match="multiple of 8"):
        W.check_reg_split(41, 232, 2)
    with pytest.raises(ValueError, match=r"CONSUMER_REGS=264 must be"):
        W.check_reg_split(24, 264, 1)


def test_v9_refuses_a_split_over_the_register_file():
    from tirx_gemm import registry
    with pytest.raises(ValueError, match="CONSUMER_REGS=248"):
        registry.get("v9", "sm_90a").build_primfunc(4096, 4096, 4096, SM_COUNT=132,
                                                    PRODUCER_REGS=24, CONSUMER_REGS=248)
