"""A config made concrete for its backend: the settings it leaves to the backend (0,
`config.BACKEND_DEFAULTS`) filled in, and the backend built for the model those settings give."""

from __future__ import annotations

from service.backend import Backend, resolve_name, select_backend
from service.config import Config, sized_for
from service.trainer import model


def sized_backend(config: Config) -> tuple[Config, Backend]:
    """`config` sized for its backend, and that backend (its kernels built for the sizes)."""
    name = resolve_name(config.train.backend)
    config = sized_for(config, name)
    return config, select_backend(name, model.dims(config), config.train.precision)
