"""`python -m tirx_gemm.cli`: the same as the `tirx-gemm` console script."""

import sys

from tirx_gemm.cli import main

sys.exit(main())
