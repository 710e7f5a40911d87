"""How much shared memory the handoff may make, from the server's settings, and the checks that
refuse more before anything is mapped (OverLimit, naming the setting)."""

from __future__ import annotations

from dataclasses import dataclass

from service.config import ServerConfig
from service.errors import OverLimit
from service.handoff.layout import Layout, RolloutShape, act_layout

MIB = 2**20


@dataclass(frozen=True)
class SlotSizes:
    """One front end's slots: `act_slots` of `act_rows` observations of `obs_dim` features,
    `rollout_slots` of `rollout_bytes` each."""

    obs_dim: int
    act_slots: int
    act_rows: int
    rollout_slots: int
    rollout_bytes: int

    @property
    def act_layout(self) -> Layout:
        return act_layout(self.act_rows, self.obs_dim)

    @property
    def act_bytes(self) -> int:
        """The Act slots' shared memory."""
        return self.act_slots * self.act_layout.nbytes

    @property
    def total_bytes(self) -> int:
        return self.act_bytes + self.rollout_slots * self.rollout_bytes


@dataclass(frozen=True)
class HandoffLimits:
    """The server's bounds: per front end (`act_slots`, `act_rows`, `rollout_slots`,
    `rollout_bytes`, each a most) and for all front ends together (`max_bytes`)."""

    act_slots: int
    act_rows: int
    rollout_slots: int
    rollout_bytes: int
    max_bytes: int

    @classmethod
    def from_config(cls, server: ServerConfig) -> HandoffLimits:
        return cls(
            act_slots=server.handoff_act_slots,
            act_rows=server.handoff_act_rows,
            rollout_slots=server.handoff_rollout_slots,
            rollout_bytes=server.max_rollout_mb * MIB,
            max_bytes=server.handoff_max_mb * MIB,
        )

    def sizes(self, obs_dim: int) -> SlotSizes:
        """A front end's slots at these bounds."""
        return SlotSizes(obs_dim, self.act_slots, self.act_rows, self.rollout_slots,
                         self.rollout_bytes)  # fmt: skip

    def check(self, sizes: SlotSizes, mapped: int) -> None:
        """OverLimit unless a front end may map `sizes` while `mapped` bytes are mapped for the
        others."""
        asked = (
            ("server.handoff_act_slots", sizes.act_slots, self.act_slots, "Act slots"),
            ("server.handoff_act_rows", sizes.act_rows, self.act_rows, "rows an Act slot"),
            ("server.handoff_rollout_slots", sizes.rollout_slots, self.rollout_slots,
             "rollout slots"),
            ("server.max_rollout_mb", sizes.rollout_bytes / MIB, self.rollout_bytes / MIB,
             "MiB a rollout slot"),
        )  # fmt: skip
        for setting, value, most, what in asked:
            if value > most:
                raise OverLimit(f"handoff: a front end asked for {value:,g} {what}; "
                                f"{setting} = {most:,g} is the most")  # fmt: skip
        if mapped + sizes.total_bytes > self.max_bytes:
            raise OverLimit(
                f"handoff: a front end's slots take {sizes.total_bytes / MIB:,.1f} MiB and "
                f"{mapped / MIB:,.1f} MiB are mapped for the others; server.handoff_max_mb = "
                f"{self.max_bytes // MIB:,} MiB is the most all front ends may map together"
            )


def check_act(rows: int, sizes: SlotSizes) -> None:
    """OverLimit unless an Act of `rows` observations fits an Act slot."""
    if rows > sizes.act_rows:
        raise OverLimit(f"Act: {rows:,} observations in one request; server.handoff_act_rows = "
                        f"{sizes.act_rows:,} is the most one request may carry")  # fmt: skip


def check_rollout(shape: RolloutShape, sizes: SlotSizes) -> Layout:
    """The rollout's layout, or OverLimit when it does not fit a rollout slot."""
    layout = shape.layout()
    if layout.nbytes > sizes.rollout_bytes:
        raise OverLimit(
            f"rollout: {shape.N} environments x {shape.T} steps with {shape.M} final "
            f"observations take {layout.nbytes / MIB:,.1f} MiB in shared memory; "
            f"server.max_rollout_mb = {sizes.rollout_bytes / MIB:,g} MiB is a rollout slot"
        )
    return layout
