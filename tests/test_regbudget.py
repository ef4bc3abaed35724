"""The setmaxnreg budget check: the arithmetic, and every warp-specialized step as built."""
from tirx_gemm.compile.regbudget import setmaxnreg_problem

V7 = ("__launch_bounds__(256) k() {}\nsetmaxnreg.dec.sync.aligned.u32 56;\n"
      "setmaxnreg.inc.sync.aligned.u32 224;\n")


def test_split_fits_from_140_registers_at_entry():
    assert setmaxnreg_problem(V7, 140) is None
    assert setmaxnreg_problem(V7, 224) is None
    why = setmaxnreg_problem(V7, 139)
    assert why and "56/224" in why and "need >= 140" in why


def test_three_warpgroups_and_no_setmaxnreg():
    src = V7.replace("256", "384").replace("56", "40").replace("224", "232")
    assert setmaxnreg_problem(src, 168) is None
    assert "need >= 168" in setmaxnreg_problem(src, 160)
    assert setmaxnreg_problem("__launch_bounds__(128) k() {}", 90) is None


def test_an_unrecognised_split_is_reported_not_passed():
    assert "cannot check" in setmaxnreg_problem(V7, None)
    assert "cannot check" in setmaxnreg_problem(V7.replace("__launch_bounds__(256)", ""), 200)
