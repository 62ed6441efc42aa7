# Plausible bug: the tokens make the round trip correctly, but the combine step forgets to undo the
# sort-by-expert permutation, so results come back in expert order instead of the original token order.
import torch
import torch.distributed as dist


def moe_forward(tokens, expert_ids, expert_fn, experts_per_rank):
    world = dist.get_world_size()
    epr = experts_per_rank
    n_tok, d = tokens.shape
    order = torch.argsort(expert_ids, stable=True)
    send_buf = tokens.index_select(0, order).contiguous()
    counts = torch.bincount(expert_ids, minlength=world * epr)
    recv_counts = torch.empty_like(counts)
    dist.all_to_all_single(recv_counts, counts)
    send_splits = counts.view(world, epr).sum(1).tolist()
    rc = recv_counts.view(world, epr)
    recv_splits = rc.sum(1).tolist()
    recv_buf = tokens.new_empty((sum(recv_splits), d))
    dist.all_to_all_single(recv_buf, send_buf, recv_splits, send_splits)
    processed = torch.empty_like(recv_buf)
    start = 0
    for src in range(world):
        for local in range(epr):
            cnt = int(rc[src, local])
            if cnt:
                processed[start:start + cnt] = expert_fn(local, recv_buf[start:start + cnt])
            start += cnt
    back = tokens.new_empty((n_tok, d))
    dist.all_to_all_single(back, processed, send_splits, recv_splits)
    return back  # BUG: should be out[order] = back
