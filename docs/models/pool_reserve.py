#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""A crude model of the VMM pool's large blocks, for docs/memory-pool.md ("How much slack").

Not the pool: page-granular best fit over free ranges with coalescing; when nothing fits, a
window at fresh addresses gets its pages from spare ones, then new ones while the pool holds
less than the peak of live pages plus `reserve_pages`, then by unmapping the tails of free
ranges. It counts one call per page created, per range unmapped, per page mapped and one
set-access per window, so its calls per op are several times the real pool's (which composes
into the window with the most pages already mapped): read only the trend, how the slack that
stops remapping changes with the number of live blocks. The trace is the large trace's:
log-uniform 1 to 64 MiB blocks replaced at random.

    python3 docs/models/pool_reserve.py [STEPS]
"""
import random, bisect, math, sys
def run(live_n, reserve_pages, steps=40000, seed=1):
    rng = random.Random(seed)
    lo, hi = 1, 64
    def draw():  # MiB log-uniform -> pages of 2 MiB
        mib = math.exp(rng.uniform(math.log(lo), math.log(hi)))
        return max(1, math.ceil(mib / 2))
    free = {}          # addr -> pages (mapped, free)
    live = []          # (addr, pages)
    tail = 0           # next fresh address (pages)
    spare = 0          # unmapped handles
    held = 0
    peak_live = 0; live_pages = 0
    calls = 0
    def insert_free(a, n):
        # coalesce with neighbours
        nxt = a + n
        if nxt in free:
            n += free.pop(nxt)
        for b, m in list(free.items()):
            if b + m == a:
                free.pop(b); a = b; n += m; break
        free[a] = n
    def alloc(S, count):
        nonlocal tail, spare, held, calls, peak_live, live_pages
        best = None
        for a, n in free.items():
            if n >= S and (best is None or n < free[best]): best = a
        if best is not None:
            n = free.pop(best)
            if n > S: free[best + S] = n - S
            return best
        # compose at the tail: S pages
        need = S
        take = min(spare, need); spare -= take; need -= take
        cap = peak_live + reserve_pages
        create = min(need, max(0, cap - held)); held += create; need -= create
        if count: calls += create
        # unmap from free ranges' tails (largest first)
        for a in sorted(free, key=lambda b: -free[b]):
            if need == 0: break
            n = free[a]; t = min(n, need)
            if count: calls += 1
            need -= t
            if t == n: free.pop(a)
            else: free[a] = n - t
        if need > 0:
            held += need
            if count: calls += need
        if count: calls += S + 1  # one map per page, one set-access
        a = tail; tail += S
        return a
    n_ops = 0
    for step in range(live_n + steps):
        count = step >= live_n + steps // 2
        if len(live) >= live_n:
            i = rng.randrange(len(live)); a, n = live[i]; live[i] = live[-1]; live.pop()
            live_pages -= n; insert_free(a, n)
        S = draw()
        a = alloc(S, count)
        live.append((a, S)); live_pages += S; peak_live = max(peak_live, live_pages)
        if count: n_ops += 1
    return calls / n_ops, held / peak_live


def main() -> None:
    steps = int(sys.argv[1]) if len(sys.argv) > 1 else 8000
    for live_n, rps in ((256, (0, 64, 128, 256, 384)), (1024, (0, 128, 384, 768)),
                        (4096, (768, 1024, 2048))):
        for rp in rps:
            c, f = run(live_n, rp, steps=steps)
            print(f"live {live_n:5d} reserve {rp:4d} pages ({rp * 2} MiB): "
                  f"calls/op {c:.3f}  held/peak {f:.3f}", flush=True)


if __name__ == "__main__":
    main()
