import torch
import torch.distributed as dist

_GROUPS: dict = {}


def _groups(world: int, rank: int, group_size: int):
    """(node group, rail group) of this rank, made once: every rank creates every group, in the same order.
    A group of one rank is None (its stage is a local copy)."""
    key = (world, group_size)
    if key not in _GROUPS:
        n_nodes = world // group_size
        node = rail = None
        for g in range(n_nodes):
            ranks = list(range(g * group_size, (g + 1) * group_size))
            made = dist.new_group(ranks) if group_size > 1 else None
            if rank in ranks:
                node = made
        for j in range(group_size):
            ranks = list(range(j, world, group_size))
            made = dist.new_group(ranks) if n_nodes > 1 else None
            if rank in ranks:
                rail = made
        _GROUPS[key] = (node, rail)
    return _GROUPS[key]


def _pack(x: torch.Tensor, meta: torch.Tensor) -> torch.Tensor:
    """Rows of bytes: each token's data, then its int64 metadata; one tensor, so one message per peer."""
    return torch.cat([x.contiguous().view(torch.uint8), meta.contiguous().view(torch.uint8)], 1)


def _stage(rows: torch.Tensor, dest: torch.Tensor, peers: int, me: int, cap: int, group,
           pad_row: torch.Tensor) -> torch.Tensor:
    """A padded all-to-all over `group`: rows[i] goes to every member p (group rank) with dest[i, p]. Each member
    gets a slab of exactly `cap` rows, the valid ones first and then padding rows, so no counts are exchanged
    first. Returns the slabs this rank holds afterwards ([peers * cap, width], its own slab without a message)."""
    width = rows.shape[1]
    send = pad_row.expand(peers, cap, width).clone()
    for p in range(peers):
        idx = dest[:, p].nonzero()[:, 0]
        send[p, :idx.numel()] = rows.index_select(0, idx)
    if group is None or peers == 1:
        return send[me]
    others = [p for p in range(peers) if p != me]
    splits = [0 if p == me else cap for p in range(peers)]
    recv = torch.empty(((peers - 1) * cap, width), dtype=torch.uint8, device=rows.device)
    dist.all_to_all_single(recv, send[others].reshape(-1, width), splits, splits, group=group)
    return torch.cat([send[me], recv])


def hierarchical_dispatch(x: torch.Tensor, topk_idx: torch.Tensor, experts_per_rank: int, group_size: int):
    rank, world = dist.get_rank(), dist.get_world_size()
    epr, L = experts_per_rank, group_size
    n_nodes = world // L
    t, d = x.shape
    k = topk_idx.shape[1]
    dev = x.device
    node_group, rail_group = _groups(world, rank, L)
    my_node, my_local = divmod(rank, L)
    ids = topk_idx.to(torch.int64)
    data_bytes = d * x.element_size()
    meta_cols = 2 + k

    # a row: the token's bytes, then int64 metadata [source rank (-1: padding), token index, its k expert ids]
    pad_row = _pack(torch.zeros((1, d), dtype=x.dtype, device=dev),
                    torch.full((1, meta_cols), -1, dtype=torch.int64, device=dev))[0]

    def meta_of(rows: torch.Tensor) -> torch.Tensor:
        return rows[:, data_bytes:].clone(memory_format=torch.contiguous_format).view(torch.int64)  # aligned copy

    # stage 1, along the rail: each token once to every node that hosts one of its experts, to the rank there with
    # my local index (the relay); at most T rows per node
    owner = torch.where(ids >= 0, ids // epr, -1)
    meta = torch.cat([torch.full((t, 1), rank, dtype=torch.int64, device=dev),
                      torch.arange(t, dtype=torch.int64, device=dev)[:, None], ids], 1)
    packed = _pack(x, meta)
    to_node = torch.zeros((t, n_nodes + 1), dtype=torch.bool, device=dev)
    to_node.scatter_(1, torch.where(owner >= 0, owner // L, n_nodes), True)
    relayed = _stage(packed, to_node[:, :n_nodes], n_nodes, my_node, t, rail_group, pad_row)

    # stage 2, inside the node: the relay forwards each token it holds to every rank of its node that hosts one of
    # the token's experts; at most n_nodes * T rows per rank
    rmeta = meta_of(relayed)
    valid = rmeta[:, 0] >= 0
    r_owner = torch.where(rmeta[:, 2:] >= 0, rmeta[:, 2:] // epr, -1)
    local = r_owner - my_node * L
    to_rank = torch.zeros((relayed.shape[0], L + 1), dtype=torch.bool, device=dev)
    to_rank.scatter_(1, torch.where((local >= 0) & (local < L) & valid[:, None], local, L), True)
    final = _stage(relayed, to_rank[:, :L], L, my_local, n_nodes * t, node_group, pad_row)

    # every token for this rank is here once; put them in (source rank, token index) order
    fmeta = meta_of(final)
    keep = (fmeta[:, 0] >= 0).nonzero()[:, 0]
    fmeta = fmeta.index_select(0, keep)
    order = torch.argsort(fmeta[:, 0] * max(t, 1) + fmeta[:, 1])
    keep, fmeta = keep[order], fmeta[order]
    recv_x = final.index_select(0, keep)[:, :data_bytes].clone(memory_format=torch.contiguous_format).view(x.dtype)
    topk = fmeta[:, 2:]
    recv_topk = torch.where(topk // epr == rank, topk - rank * epr, -1)
    return recv_x, fmeta[:, :2].contiguous(), recv_topk
