import torch
import torch.distributed as dist


def zero1_step(params: torch.Tensor, grad: torch.Tensor, exp_avg: torch.Tensor, exp_avg_sq: torch.Tensor,
               step: int, lr: float, beta1: float, beta2: float, eps: float,
               weight_decay: float) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """params: [N], the same on every rank; grad: [N], this rank's own gradient; exp_avg, exp_avg_sq: the AdamW
    state of this rank's slice [r*c, min(N, (r+1)*c)), c = ceil(N / world). Return (new params [N], identical on
    every rank; new exp_avg; new exp_avg_sq) after one AdamW step on the mean gradient over ranks."""
    rank, world = dist.get_rank(), dist.get_world_size()
    # TODO: implement
    raise NotImplementedError
