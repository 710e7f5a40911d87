"""A pytest plugin that gives the test process the `trident` command's arithmetic.

pyproject.toml loads it with `-p`, which pytest does before the plugins installed packages
register and before any conftest, so NumPy is not loaded yet: a test's in-process twin then
computes what the server processes it starts compute, to the bit, on an AVX-512 processor too
(there NumPy's own float32 exp and log1p differ from its AVX2 ones in the last bit).
"""

import sys

from service.arithmetic import pin_arithmetic

if pin_arithmetic() and "numpy" in sys.modules:
    raise RuntimeError(
        "NumPy was loaded before service.testing.pinned_arithmetic could pin its arithmetic; "
        "set TRIDENT_NATIVE_ARITHMETIC=1 to test NumPy's native loops instead"
    )
