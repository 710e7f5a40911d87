"""glibc allocator settings (service/backend/host_memory.py)."""

from __future__ import annotations

import platform
import signal
import sys

import pytest

from service.backend import host_memory
from service.config import with_overrides


@pytest.mark.skipif(platform.libc_ver()[0] != "glibc", reason="glibc only")
def test_glibc_accepts_the_settings() -> None:
    assert host_memory.retain_freed_memory()
    assert host_memory.limit_malloc_arenas()


def test_serve_tunes_the_process_before_starting(monkeypatch: pytest.MonkeyPatch) -> None:
    """`serve` caps the arenas (see limit_malloc_arenas) and sets the GIL's switch interval
    (server.gil_switch_interval_ms) before gRPC starts its threads."""
    from service.server import app

    calls: list[str] = []
    monkeypatch.setattr(app, "limit_malloc_arenas", lambda: calls.append("arenas"))

    def start(*args: object, **kwargs: object) -> None:
        calls.append("start")
        raise RuntimeError("stop here")

    monkeypatch.setattr(app, "start", start)
    monkeypatch.setattr(app.logs, "configure", lambda level: None)  # keep pytest's logging
    handlers = {signum: signal.getsignal(signum) for signum in (signal.SIGTERM, signal.SIGINT)}
    interval = sys.getswitchinterval()
    config = with_overrides(app.Config(), ["server.gil_switch_interval_ms=2.5"])
    try:
        with pytest.raises(RuntimeError, match="stop here"):
            app.serve(config)
        assert sys.getswitchinterval() == pytest.approx(0.0025)
    finally:
        sys.setswitchinterval(interval)
        for signum, handler in handlers.items():
            signal.signal(signum, handler)
    assert calls == ["arenas", "start"]
