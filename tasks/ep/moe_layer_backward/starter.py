import torch
import torch.distributed as dist
import torch.nn.functional as F


def moe_layer_backward(x: torch.Tensor, topk_idx: torch.Tensor, gates: torch.Tensor, dy: torch.Tensor,
                       w1: torch.Tensor, w3: torch.Tensor, w2: torch.Tensor
                       ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """Return (dx, dgates, dw1, dw3, dw2), the gradients of L = sum(y * dy) for the layer
    y_i = sum_j gates[i, j] * expert_{topk_idx[i, j]}(x_i), expert_e(v) = (silu(v @ w1[l]) * (v @ w3[l])) @ w2[l]:
    dx and dgates for this rank's tokens, dw1, dw3, dw2 for this rank's own experts (summed over the tokens of all
    ranks). Expert e lives on rank e // experts_per_rank as local expert l = e % experts_per_rank."""
    rank, world = dist.get_rank(), dist.get_world_size()
    # TODO: implement
    raise NotImplementedError
