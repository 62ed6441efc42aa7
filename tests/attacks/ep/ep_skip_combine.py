# TASK: ep/moe_dispatch_combine
# EXPECT: wrong_answer
# Dispatches for real and runs every expert on exactly the tokens routed to it (so a check of which rows each
# expert processed passes), but skips the combine: each owner fits its experts' per-feature scale and bias from the
# rows it processed, the parameters are all-gathered (2 * E * d values instead of the T * d results) and every
# rank computes its outputs itself. Outputs of experts with few rows come back for real.
# Stopped by the golden semantics: an expert's output depends on the exact bits of each row through keys that
# stay in the harness, so the outputs themselves must travel back.
import torch
import torch.distributed as dist

FEW = 8  # experts with fewer rows send their outputs back for real


def _fit(x, y):
    """Per-feature least squares y = x * scale + bias."""
    x, y = x.double(), y.double()
    xc, yc = x - x.mean(0), y - y.mean(0)
    scale = (xc * yc).sum(0) / (xc * xc).sum(0)
    return scale, y.mean(0) - scale * x.mean(0)


def moe_forward(tokens, expert_ids, expert_fn, experts_per_rank):
    rank, world = dist.get_rank(), dist.get_world_size()
    epr = experts_per_rank
    n_exp, (n_tok, d) = world * epr, tokens.shape
    ids = expert_ids.reshape(-1)
    dev = tokens.device
    counts = torch.bincount(ids, minlength=n_exp)
    every = torch.empty(world * n_exp, dtype=counts.dtype, device=dev)
    dist.all_gather_into_tensor(every, counts)
    routed = every.view(world, n_exp).sum(0)
    fit = routed >= FEW  # the same on every rank

    # the honest dispatch
    order = torch.argsort(ids, stable=True)
    send = tokens.index_select(0, order).contiguous()
    rc = every.view(world, n_exp)[:, rank * epr:(rank + 1) * epr]  # [source, local expert]
    send_splits = counts.view(world, epr).sum(1).tolist()
    recv_splits = rc.sum(1).tolist()
    recv = tokens.new_empty((sum(recv_splits), d))
    dist.all_to_all_single(recv, send, recv_splits, send_splits)
    local = torch.arange(epr, device=dev).repeat(world).repeat_interleave(rc.reshape(-1), output_size=recv.shape[0])
    done = torch.empty_like(recv)
    params = torch.zeros((2, epr, d), dtype=torch.float64, device=dev)
    for j in range(epr):
        rows = (local == j).nonzero().flatten()
        if rows.numel():
            x = recv.index_select(0, rows)
            out = expert_fn(j, x)
            done[rows] = out
            if bool(fit[rank * epr + j]):
                params[0, j], params[1, j] = _fit(x, out)

    # no combine: share the fitted parameters instead of the results
    gathered = torch.empty((world * 2, epr, d), dtype=torch.float64, device=dev)
    dist.all_gather_into_tensor(gathered, params)
    scale, bias = gathered.view(world, 2, epr, d).permute(1, 0, 2, 3).reshape(2, n_exp, d)
    y = (tokens.double() * scale[ids] + bias[ids]).to(tokens.dtype)

    if bool((~fit & (routed > 0)).any()):  # outputs of the small experts come back for real
        keep = ~fit[rank * epr + local]
        src = torch.arange(world, device=dev).repeat_interleave(rc.sum(1), output_size=recv.shape[0])
        back_send = torch.bincount(src[keep], minlength=world).tolist()
        sent_ids = ids[order]
        small = ~fit[sent_ids]
        back_recv = torch.bincount(sent_ids[small] // epr, minlength=world).tolist()
        back = tokens.new_empty((sum(back_recv), d))
        dist.all_to_all_single(back, done[keep].contiguous(), back_recv, back_send)
        y[order[small]] = back
    return y
