# Source this (bash, from the repository root, in the sim venv) to point cargo at the crates
# vendored in vendor/numsim, for running tirx-harness NumSim by hand. `tirx-gemm sim` and
# tests/test_sim.py need none of this: they do the same by themselves unless CARGO_HOME is
# set (tirx_gemm/sim/environment.py, use_vendored_crates).
#   . scripts/numsim_env.sh
_numsim_home=$(python -c 'from tirx_gemm.sim.environment import unpack_crates; print(unpack_crates())') \
  && export CARGO_HOME="$_numsim_home" && echo "CARGO_HOME=$CARGO_HOME (vendor/numsim's crates)"
unset _numsim_home
