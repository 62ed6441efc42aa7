# Spawns a helper process.
import subprocess

import torch


def all_reduce(x: torch.Tensor) -> torch.Tensor:
    subprocess.run(["true"])
    return x.clone()
