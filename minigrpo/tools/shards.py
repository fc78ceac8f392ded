"""A sweep past one process: under torchrun, each process (rank) makes its share of the runs, and rank 0 writes
what one process would.

    torchrun --standalone --nproc-per-node 2 -m minigrpo.compare --engine population --seeds 64 --reward pizza
    shard = join()                   # rank and world size from torchrun's environment (one process: 0 of 1)
    mine = shard.mine(todo)          # runs rank, rank + size, rank + 2·size, ... of the same list on every rank
    everyone = shard.gather(errors)  # rank 0: every rank's object, in rank order; the others: None
    value = shard.share(value)       # rank 0's value, on every rank

The runs never talk to each other: each rank makes its own (with either engine) into the shared --out folder, and
torch.distributed only carries the bookkeeping (barriers, the runs' error lines) over gloo on the CPU, NCCL on
GPUs (each rank on its own GPU, LOCAL_RANK). Across machines the same command runs with torchrun's --nnodes and
a rendezvous (--rdzv-endpoint) on every node; --out must then be a folder every node sees (a shared file system),
since rank 0 reads every run's files to write the table.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

import torch
import torch.distributed as dist


@dataclass
class Shard:
    rank: int = 0
    size: int = 1

    def mine(self, items: list) -> list:
        return items[self.rank::self.size]

    def barrier(self) -> None:
        if self.size > 1:
            dist.barrier()

    def share(self, obj):
        """Rank 0's obj, on every rank."""
        if self.size == 1:
            return obj
        box = [obj]
        dist.broadcast_object_list(box, src=0)
        return box[0]

    def gather(self, obj) -> list | None:
        if self.size == 1:
            return [obj]
        out = [None] * self.size if self.rank == 0 else None
        dist.gather_object(obj, out, dst=0)
        return out

    def leave(self) -> None:
        if self.size > 1:
            dist.destroy_process_group()


def join() -> Shard:
    """This process's share: from torchrun's RANK, WORLD_SIZE and LOCAL_RANK (absent: the whole sweep)."""
    size = int(os.environ.get("WORLD_SIZE", "1"))
    if size == 1:
        return Shard()
    if torch.cuda.is_available():  # each rank's runs on its own GPU ("cuda" then means that one)
        torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", "0")))
    dist.init_process_group("nccl" if torch.cuda.is_available() else "gloo")
    return Shard(dist.get_rank(), dist.get_world_size())
