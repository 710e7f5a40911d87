"""Observations from a `.npy` file, as `trident act` sends them: float32 [N, D].

The file is read with `numpy.lib.format` and `allow_pickle=False`, so a file that is not `.npy`
(or holds Python objects) is named as such instead of surfacing NumPy's pickle message.
"""

from __future__ import annotations

import os

import numpy as np

from service.errors import InvalidInput

WHAT = "a .npy file (numpy.save) of float32 observations [N, D]"


def load_observations(path: str | os.PathLike[str]) -> tuple[np.ndarray, np.dtype | None]:
    """The observations in `path` as float32 [N, D], and the dtype they were converted from
    (None when the file holds float32). Integer and other float dtypes are converted; anything
    else (not .npy, not 2-D, not real numbers) is InvalidInput naming the file."""
    name = os.fspath(path)
    try:
        with open(path, "rb") as file:
            try:
                np.lib.format.read_magic(file)
            except ValueError:
                raise InvalidInput("obs", WHAT, f"{name}, which is not a .npy file") from None
            file.seek(0)
            obs = np.lib.format.read_array(file, allow_pickle=False)
    except OSError as error:
        raise InvalidInput("obs", WHAT, f"{name}: {error.strerror}") from None
    except ValueError as error:  # an object array, or a truncated file
        raise InvalidInput("obs", WHAT, f"{name}, which NumPy cannot read ({error})") from None
    if not (np.issubdtype(obs.dtype, np.integer) or np.issubdtype(obs.dtype, np.floating)):
        raise InvalidInput("obs", WHAT, f"dtype {obs.dtype} in {name}")
    if obs.ndim != 2:
        raise InvalidInput("obs", WHAT, f"shape {obs.shape} in {name}")
    if obs.dtype == np.float32:
        return obs, None
    return obs.astype(np.float32), obs.dtype
