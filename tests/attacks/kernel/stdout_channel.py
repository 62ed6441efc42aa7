# Class 5 (cross-rank files): each rank prints its input, which the judge's own file descriptor writes into the
# rank's folder (no audit hook sees that write), and reads its peers' stdout.txt to sum their inputs without any
# communication. Landlock keeps every rank out of its peers' folders: the read fails.
import os

import torch
import torch.distributed as dist


def all_reduce(x: torch.Tensor) -> torch.Tensor:
    rank, world = dist.get_rank(), dist.get_world_size()
    print("DATA", rank, ",".join(repr(v) for v in x.double().tolist()), flush=True)
    out = x.double().clone()
    here = os.getcwd()
    for peer in range(world):
        if peer == rank:
            continue
        path = os.path.join(os.path.dirname(here), f"rank{peer}", "stdout.txt")
        values = None
        for _ in range(200):
            try:
                with open(path) as f:
                    lines = [ln for ln in f.read().splitlines() if ln.startswith(f"DATA {peer} ")]
            except OSError as exc:
                print("DENIED", type(exc).__name__)
                break
            if lines:
                values = [float(v) for v in lines[-1].split(" ", 2)[2].split(",")]
                break
        if values is not None and len(values) == x.numel():
            print("READ-PEER", peer)
            out += torch.tensor(values, dtype=torch.float64).reshape(x.shape)
    return out.to(x.dtype)
