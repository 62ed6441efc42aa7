# CPU model of the variant's ring: the launch() sizing, the segment/slot/step schedule and the flag waits;
# steps run atomically in a random order among those whose waits are met. Checks sums, slot reuse, no deadlock.
import random, sys

def ceil_div(x, y): return (x + y - 1) // y

def sizing(count, W, esz, channels, K, S, scratch=8 << 20, threads=256, unroll=2, maxslot=256 << 10):
    vec = 16 // esz
    rb = threads * unroll * 16
    raw = scratch // (channels * S)
    slot = raw // rb * rb if raw >= rb else (raw // 128 * 128 if raw >= 128 else raw // 16 * 16)
    slot = min(slot, maxslot)
    smax = slot // esz
    sl = ceil_div(ceil_div(count, W * channels), vec) * vec
    sl = min(sl, smax); sl = max(sl, vec)
    segs = ceil_div(count, W * sl)
    grid = max(1, min(segs, channels))
    return slot, sl, segs, grid

def run(count, W, channels, K, S, esz=4, seed=0, scratch=8 << 20):
    rnd = random.Random(seed)
    slot, sl, segs, G = sizing(count, W, esz, channels, K, S, scratch)
    assert S * slot * G <= scratch
    x = [[rnd.randint(-50, 50) for _ in range(count)] for _ in range(W)]
    out = [[None] * count for _ in range(W)]
    # fifo[r][b][slot] = (seq, data list) ; posted[r][b], consumed[r][b]
    fifo = [[[None] * S for _ in range(G)] for _ in range(W)]
    posted = [[0] * G for _ in range(W)]
    consumed = [[0] * G for _ in range(W)]
    def program(r, b):  # list of steps of rank r channel b, in kernel order
        steps = []
        g0 = b
        while g0 < segs:
            nk = 1
            while nk < K and g0 + nk * G < segs: nk += 1
            for t in range(2 * W - 1):
                c = (r - t) % W
                for i in range(nk):
                    lo = (g0 + i * G) * W * sl + c * sl
                    ln = min(sl, count - lo) if lo < count else 0
                    steps.append((t, lo, ln))
            g0 += K * G
        return steps
    progs = {(r, b): program(r, b) for r in range(W) for b in range(G)}
    pc = {k: 0 for k in progs}; sends = {k: 0 for k in progs}; recvs = {k: 0 for k in progs}
    while True:
        ready = []
        for (r, b), p in progs.items():
            if pc[(r, b)] >= len(p): continue
            t, lo, ln = p[pc[(r, b)]]
            recv, send = t >= 1, t <= 2 * W - 3
            ok = True
            if recv and posted[r][b] < recvs[(r, b)] + 1: ok = False
            if send and sends[(r, b)] >= S and consumed[r][b] < sends[(r, b)] - S + 1: ok = False
            if ok: ready.append((r, b))
        if not ready:
            if all(pc[k] >= len(progs[k]) for k in progs): break
            raise RuntimeError("deadlock")
        r, b = rnd.choice(ready)
        t, lo, ln = progs[(r, b)][pc[(r, b)]]
        recv, send = t >= 1, t <= 2 * W - 3
        nxt, prv = (r + 1) % W, (r - 1) % W
        q_in = recvs[(r, b)] % S; q_out = sends[(r, b)] % S
        if recv:
            seq, data = fifo[r][b][q_in]
            assert seq == recvs[(r, b)], ("stale slot", seq, recvs[(r, b)])
            assert len(data) == ln
        xv = x[r][lo:lo + ln]
        if t == 0: v = xv
        elif t <= W - 1: v = [a + bb for a, bb in zip(data, xv)]
        else: v = data
        if t >= W - 1:
            for j, e in enumerate(v): out[r][lo + j] = e
        if send:
            old = fifo[nxt][b][q_out]
            if old is not None:
                assert old[0] < sends[(r, b)] and consumed[r][b] >= old[0] + 1, "overwrote an unread slot"
            fifo[nxt][b][q_out] = (sends[(r, b)], list(v))
            sends[(r, b)] += 1
            posted[nxt][b] = sends[(r, b)]
        if recv:
            fifo[r][b][q_in] = (fifo[r][b][q_in][0], ["DISCARDED"] * ln)  # discard: contents now garbage
            recvs[(r, b)] += 1
            consumed[prv][b] = recvs[(r, b)]
        pc[(r, b)] += 1
    want = [sum(x[r][i] for r in range(W)) for i in range(count)]
    for r in range(W):
        assert out[r] == want, (r, [i for i in range(count) if out[r][i] != want[i]][:5])
    return slot, sl, segs, G

cfgs = []
for W in (2, 3, 4, 8):
    for K, S in ((2, 5), (3, 5)):
        for count in (1, 3, 7, 4099, 300007 // 37, 5000, 96 * 130, 385):
            for ch in (1, 3, 5, 198 // W):
                cfgs.append((count, W, ch, K, S))
n = 0
for count, W, ch, K, S in cfgs:
    # a small scratch too, so that big counts need many segments per channel
    for scratch in (8 << 20, 96 << 10, 16 << 10):
        for seed in range(2):
            run(count, W, ch, K, S, seed=seed, scratch=scratch)
            n += 1
print("ok", n)
for W in (2, 4, 8):
    ch = 132 * 3 // W
    print(W, sizing(64 << 20 >> 2, W, 4, min(ch, 1024), 2, 5))
