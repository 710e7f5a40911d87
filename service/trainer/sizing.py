"""A config made concrete for its backend: the settings it leaves to the backend (0 / 'auto',
`config.BACKEND_DEFAULTS`) filled in, and the backend built for the model those settings give."""

from __future__ import annotations

from service.backend import Backend, cuda_available, select_backend
from service.config import Config, sized_for
from service.trainer import model


def backend_name(config: Config) -> str:
    """The backend `train.backend` names: 'auto' is 'cuda' where CuPy sees a GPU, else 'numpy'."""
    name = config.train.backend
    if name == "auto":
        return "cuda" if cuda_available() else "numpy"
    return name


def sized_backend(config: Config) -> tuple[Config, Backend]:
    """`config` sized for its backend, and that backend (its kernels built for the sizes)."""
    name = backend_name(config)
    config = sized_for(config, name)
    return config, select_backend(name, model.dims(config))
