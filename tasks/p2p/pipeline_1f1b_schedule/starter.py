from typing import Callable

import torch
import torch.distributed as dist


def pipeline_step(micro_batches: torch.Tensor | None, targets: torch.Tensor | None,
                  forward: Callable[[int, torch.Tensor], torch.Tensor],
                  backward: Callable[[int, torch.Tensor], torch.Tensor],
                  num_micro_batches: int, template: torch.Tensor) -> torch.Tensor | None:
    """Run forward and backward of every micro-batch through the pipeline (stage = rank), holding at most
    P - s micro-batches on stage s at once. Stage 0 returns the input gradients [M, b, d], the last stage its
    outputs [M, b, d], every other stage None."""
    rank, world = dist.get_rank(), dist.get_world_size()
    # TODO: implement
    raise NotImplementedError
