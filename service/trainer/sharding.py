"""Which shards of a data-parallel Step a trainer holds.

`train.data_shards` = S splits a Step's N environment columns into S equal blocks. Everything
row-wise follows the columns: shard s's rows are its columns' steps, its minibatch order sorts
them by their global Philox keys, and its replay ring keeps its columns' transitions and
draws its share of each replay batch. A world of W ranks (W divides S) gives rank r the
shards [r·S/W, (r+1)·S/W) and a communicator that sums what the ranks computed; a single
trainer holds every shard and sums nothing, and computes the same Step: the test of the ranks.
"""

from __future__ import annotations

from dataclasses import dataclass

from service.backend.comm import Communicator, SingleRank
from service.errors import InvalidInput


@dataclass(frozen=True)
class Sharding:
    shards: int  # S, train.data_shards
    owned: range  # the shards this trainer holds, contiguous
    comm: Communicator

    @classmethod
    def of(cls, shards: int, comm: Communicator | None = None) -> Sharding:
        comm = comm or SingleRank()
        world, rank = comm.world_size, comm.rank
        if shards % world:
            raise InvalidInput("train.data_shards", f"a multiple of the world size {world}",
                               repr(shards))  # fmt: skip
        per_rank = shards // world
        return cls(shards, range(rank * per_rank, (rank + 1) * per_rank), comm)

    @property
    def parallel(self) -> bool:
        """Whether sums go through the communicator: any but SingleRank's (NCCL with one
        rank too, so one GPU runs the ranks' code path)."""
        return not isinstance(self.comm, SingleRank)

    def global_columns(self, local_columns: int) -> int:
        """N of the whole Step, from the columns this trainer was given."""
        if local_columns % len(self.owned):
            raise InvalidInput("rollout columns", f"a multiple of {len(self.owned)} (the shards "
                               "this trainer holds)", str(local_columns))  # fmt: skip
        return local_columns // len(self.owned) * self.shards
