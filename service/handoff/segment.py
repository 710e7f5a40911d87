"""Shared memory with no name (memfd): the learner makes each segment and hands its file
descriptor to the front end over the control channel. No name means nothing in /dev/shm to
leak: the kernel frees the memory once the last process that maps it unmaps it or dies,
whichever side is SIGKILLed."""

from __future__ import annotations

import mmap
import os


class Segment:
    """`size` bytes of shared memory mapped in this process (`.buffer`, for NumPy views)."""

    def __init__(self, fd: int, size: int) -> None:
        """Map an open segment; `fd` stays open (`send`, then `close_fd`) and owned here."""
        self.fd, self.size = fd, size
        self.buffer = mmap.mmap(fd, size) if size else mmap.mmap(-1, 1)

    @classmethod
    def create(cls, name: str, size: int) -> Segment:
        """A new zero-filled segment; its pages take memory only once written."""
        fd = os.memfd_create(name, os.MFD_CLOEXEC)
        try:
            os.ftruncate(fd, size)
            return cls(fd, size)
        except BaseException:
            os.close(fd)
            raise

    def close_fd(self) -> None:
        """Close the descriptor: the mapping stays, and with it the memory."""
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1

    def close(self) -> bool:
        """Unmap; False where a NumPy view over it is still alive somewhere, in which case the
        mapping goes with the last view (Python keeps it alive until then)."""
        self.close_fd()
        try:
            self.buffer.close()
        except BufferError:
            return False
        return True
