# Correct but slow: a flat dispatch over the whole world, ignoring the nodes: the counts first, then the payload
# and its metadata, each a world-wide all-to-all (three collectives of world_size - 1 steps each).
import torch
import torch.distributed as dist


def hierarchical_dispatch(x, topk_idx, experts_per_rank, group_size):
    rank, world = dist.get_rank(), dist.get_world_size()
    epr = experts_per_rank
    t, d = x.shape
    dev = x.device
    owner = torch.where(topk_idx >= 0, topk_idx // epr, -1)
    send_idx = [(owner == p).any(1).nonzero()[:, 0] for p in range(world)]
    counts = torch.tensor([i.numel() for i in send_idx], dtype=torch.int64, device=dev)
    recv_counts = torch.empty_like(counts)
    dist.all_to_all_single(recv_counts, counts)
    cat = torch.cat(send_idx)
    send_meta = torch.cat([torch.full((cat.numel(), 1), rank, dtype=torch.int64, device=dev), cat[:, None],
                           topk_idx[cat]], 1)
    n_in = recv_counts.tolist()
    splits = counts.tolist()
    recv_x = x.new_empty((sum(n_in), d))
    recv_meta = torch.empty((sum(n_in), send_meta.shape[1]), dtype=torch.int64, device=dev)
    dist.all_to_all_single(recv_x, x[cat].contiguous(), n_in, splits)
    dist.all_to_all_single(recv_meta, send_meta, n_in, splits)
    topk = recv_meta[:, 2:]
    return recv_x, recv_meta[:, :2].contiguous(), torch.where(topk // epr == rank, topk - rank * epr, -1)
