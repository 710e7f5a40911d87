"""The op set: both backends implement every op of `OpSet` with its parameter names.

mypy (`.ci/run`) checks that `numpy_ops` and `CudaOps` conform to the protocol (arity, kinds,
types) but not the names of positional parameters, which callers use as keywords; these tests
compare the names, and need no GPU (building `CudaOps` compiles nothing). The CUDA half skips
where CuPy is not installed.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable

import pytest

from service.backend import numpy_ops
from service.backend.opset import OP_NAMES, OpSet


def parameters(fn: Callable[..., object]) -> list[str]:
    return [name for name in inspect.signature(fn).parameters if name != "self"]


def test_op_names_are_the_protocols_methods() -> None:
    declared = [n for n, v in vars(OpSet).items() if inspect.isfunction(v) and n[0] != "_"]
    assert list(OP_NAMES) == declared
    assert len(set(OP_NAMES)) == len(OP_NAMES) >= 40


@pytest.mark.parametrize("name", OP_NAMES)
def test_numpy_ops_has_every_op_with_the_protocols_parameters(name: str) -> None:
    assert parameters(getattr(numpy_ops, name)) == parameters(getattr(OpSet, name))


@pytest.mark.parametrize("name", OP_NAMES)
def test_cuda_ops_has_every_op_with_the_protocols_parameters(name: str) -> None:
    pytest.importorskip("cupy", reason="cupy is not installed")
    from service.backend.cuda.loader import CudaDims
    from service.backend.cuda.ops import CudaOps

    ops = CudaOps(CudaDims(D=16, H=256, A=9, Z=51, K=4))
    assert parameters(getattr(ops, name)) == parameters(getattr(OpSet, name))


def test_cuda_ops_has_no_op_outside_the_protocol() -> None:
    pytest.importorskip("cupy", reason="cupy is not installed")
    from service.backend.cuda.ops import CudaOps

    public = {n for n in dir(CudaOps) if not n.startswith("_") and callable(getattr(CudaOps, n))}
    assert public == set(OP_NAMES)
