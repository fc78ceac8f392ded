"""A sweep past one process: under torchrun, each process (rank) makes its share of the runs, and
rank 0 writes what one process would.

    torchrun --standalone --nproc-per-node 2 -m minigrpo.compare --engine population --seeds 64
    --reward pizza
    shard = join()                   # rank and world size from torchrun's environment (one process:
                                     # 0 of 1)
    mine = shard.mine(todo)          # runs rank, rank + size, rank + 2·size, ... of the same list
                                     # on every rank
    everyone = shard.gather(errors)  # rank 0: every rank's object, in rank order; the others: None
    value = shard.share(value)       # rank 0's value, on every rank

The runs never talk to each other: each rank makes its own (with either engine) into the shared
--out folder, and torch.distributed only carries the bookkeeping (barriers, the runs' error lines)
over gloo, GPUs or not: Python objects, no tensors (NCCL, the usual choice for GPUs, would give each
rank's bookkeeping a CUDA context and a communicator, and want a GPU of its own for each rank). On a
node with GPUs each rank's runs use one of them (`join`). Across machines the same command runs with
torchrun's --nnodes and a rendezvous (--rdzv-endpoint) on every node; --out must then be a folder
every node sees (a shared file system), since rank 0 reads every run's files to write the table.
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
        return items[self.rank :: self.size]

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
    """This process's share: from torchrun's RANK, WORLD_SIZE and LOCAL_RANK (absent: the whole
    sweep). On a node with GPUs, the rank's runs go to its LOCAL_RANK-th GPU (round them where the
    ranks outnumber the GPUs): "cuda" means that one in this process, and the worker processes it
    starts (the pool's, the populations') see that one alone (CUDA_VISIBLE_DEVICES, which they
    inherit; a worker would otherwise take the first GPU of the node)."""
    size = int(os.environ.get("WORLD_SIZE", "1"))
    if size == 1:
        return Shard()
    gpus = torch.cuda.device_count()
    if gpus:
        index = int(os.environ.get("LOCAL_RANK", "0")) % gpus
        torch.cuda.set_device(index)
        visible = os.environ.get("CUDA_VISIBLE_DEVICES")  # ids or UUIDs; unset: every GPU, by index
        os.environ["CUDA_VISIBLE_DEVICES"] = (
            visible.split(",") if visible else [str(i) for i in range(gpus)]
        )[index]
    dist.init_process_group("gloo")
    return Shard(dist.get_rank(), dist.get_world_size())
