"""A config made concrete for its backend: the settings it leaves to the backend (0,
`config_sizes.BACKEND_DEFAULTS`) filled in, and the backend built for the model those settings
give."""

from __future__ import annotations

from service.backend import Backend, resolve_name, select_backend
from service.config import Config
from service.config_sizes import job_sized, sized_for
from service.trainer import model


def sized_backend(config: Config, job: bool = False) -> tuple[Config, Backend]:
    """`config` sized for its backend (`job`: an in-process job's, train.steps too), and that
    backend (its kernels built for the sizes)."""
    name = resolve_name(config.train.backend)
    config = job_sized(config, name) if job else sized_for(config, name)
    return config, select_backend(name, model.dims(config), config.train.precision)
