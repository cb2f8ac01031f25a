#!/usr/bin/env python3
"""The imbalance `make demo` can print while every group stays on one engine.

make demo sends 6,000 requests, each to one of 32 groups drawn uniformly, through 4 engines.
cache_aware keeps a group on the engine that took its first request unless a holder is hot (the
spill gate, far above the demo's 8 requests in flight at SMG's thresholds), so an engine's count
is the sum of its groups' counts. Even with the best placement (8 groups on each engine) those
sums are Multinomial(6000, 1/4 each), and the table prints max/mean to two decimals. This gives,
exactly, how often that prints as 1.00, 1.01, ... (by Poissonization: four independent
Poisson(1500) counts conditioned on their sum being 6000).

Then a count model of what would reach 1.00 (not built in kvgate): requests in order, each group's
first placed on the engine with the fewest groups; later ones to the group's holder with the
fewest requests so far, unless that holder is more than MARGIN requests above the mean and an
engine is below it: then the least-counted engine takes it and becomes a holder (a replica: one
cold prefill). It ignores timing and the engines' caches; it counts the replicas such a rule makes.

Last, the rule as kvgate builds it (`--bounded-load-margin N`, `cache_aware::bounded_load`), and
the bounds it was chosen from: a group's request goes to its least-sent holder whose count stays
within the bound after it (or, `uniform`, to any such holder at random, as a choice by expected
wait would be on this workload); none within: the least-sent engine, which becomes a holder.
Bounds `mean + N` and `ceil(mean * (1 + e))`; `stale 2` decides on counts that miss the last two
dispatches (two data cores deciding at once).

Last, the same draws with each engine's cache as an LRU of CACHE_PROMPTS system prompts (10: the
room that reproduces the cold prompts measured through kvgate at margins 4, 8 and 16, see
perf/results-routing-2.md), so a rule's cost is counted as `make demo` pays it: cold prompts, not
replicas. Rules, each at a bound of mean + margin: `least-sent` (as built), `home-first` (the
group's first holder while within the bound), `spill` (an overflow goes to the least-sent engine
and is not recorded, so the group stays home), `move` (an overflow moves the whole group to the
least-sent engine), `room R` (least-sent, but a replica only onto an engine below the mean that
holds fewer than R groups; none: the holder keeps it), `room R + spill` (none: a spill),
`room R + swap` (none: the least-sent engine below the mean gives up a replica it took for the
least-sent home, when that home is less sent than this group's, and takes this one instead).

    scripts/demo-imbalance-bound.py [REQUESTS] [ENGINES]
    scripts/demo-imbalance-bound.py --caches [--room PROMPTS] [REQUESTS] [ENGINES]   (the last part)
"""
import math
import random
import sys
from collections import OrderedDict

args = sys.argv[1:]
caches_only = "--caches" in args
CACHE_PROMPTS = 10
if "--room" in args:
    CACHE_PROMPTS = int(args[args.index("--room") + 1])
    del args[args.index("--room"):args.index("--room") + 2]
args = [a for a in args if a != "--caches"]
requests = int(args[0]) if len(args) > 0 else 6000
engines = int(args[1]) if len(args) > 1 else 4
mean = requests / engines


def with_caches(seed, margin, rule, groups=32):
    """One run of `rule` (see the docstring) with LRU caches: (imbalance, cold prompts)."""
    rng = random.Random(seed)
    counts, holders, hosted = [0] * engines, {}, [set() for _ in range(engines)]
    caches = [OrderedDict() for _ in range(engines)]
    cold = 0
    for _ in range(requests):
        group = rng.randrange(groups)
        so_far = sum(counts) / engines
        limit = so_far + margin
        if group not in holders:
            e = min(range(engines), key=lambda e: (len(hosted[e]), counts[e]))
            holders[group] = [e]
            hosted[e].add(group)
        else:
            held = holders[group]
            within = [h for h in held if counts[h] + 1 <= limit]
            if within:
                e = within[0] if rule in ("home-first", "spill") else min(within, key=lambda h: counts[h])
            else:
                below = [x for x in range(engines) if counts[x] < so_far]
                spill = rule == "spill"
                if rule.startswith("room"):
                    roomy = [x for x in below if len(hosted[x]) < int(rule.split()[1])]
                    spill = not roomy and rule.endswith("+ spill")
                    if not roomy and rule.endswith("+ swap"):
                        roomy = swap_room(below, held, holders, hosted, counts)
                    below = below if spill else roomy
                if not below:
                    e = min(held, key=lambda h: counts[h])
                else:
                    e = min(below, key=lambda x: counts[x])
                    if rule == "move":
                        holders[group] = [e]
                    elif not spill and e not in held:
                        held.append(e)
                        hosted[e].add(group)
        cache = caches[e]
        if group in cache:
            cache.move_to_end(group)
        else:
            cold += 1
            cache[group] = True
            if len(cache) > CACHE_PROMPTS:
                cache.popitem(last=False)
        counts[e] += 1
    return max(counts) / mean, cold


def swap_room(below, held, holders, hosted, counts):
    """`room R + swap`: no engine below the mean has room, so the least-sent of them that does not
    hold the group gives up a replica it took for another engine's group, the one whose home is
    the least sent, if that home is less sent than this group's: the group goes back to its
    home alone, and the place it frees takes the replica. The engine as a list, or none."""
    targets = [x for x in below if x not in held]
    if not targets:
        return []
    target = min(targets, key=lambda x: counts[x])
    taken = [g for g in hosted[target] if holders[g][0] != target]
    if not taken:
        return []
    given_up = min(taken, key=lambda g: counts[holders[g][0]])
    if counts[holders[given_up][0]] >= counts[held[0]]:
        return []
    hosted[target].discard(given_up)
    holders[given_up].remove(target)
    return [target]


def print_with_caches(seeds=100):
    print(f"with caches of {CACHE_PROMPTS} prompts per engine (no bound: 32 cold prompts, the "
          "groups' first requests):")
    rules = ["least-sent", "home-first", "spill", "move", "room 10", "room 11", "room 10 + spill",
             "room 10 + swap"]
    for margin in [4, 8, 16]:
        for rule in rules if CACHE_PROMPTS == 10 else ["least-sent"]:
            runs = [with_caches(seed, margin, rule) for seed in range(seeds)]
            imbalances = sorted(r[0] for r in runs)
            cold = sorted(r[1] for r in runs)
            ones = sum(x < 1.005 for x in imbalances) / seeds
            print(f"margin {margin}, {rule}: prints 1.00 in {ones:.0%} of {seeds} seeds; worst "
                  f"{imbalances[-1]:.4f}; cold prompts median {cold[seeds // 2]}, most {cold[-1]}")


if caches_only:
    print_with_caches()
    sys.exit(0)


def poisson(x, lam):
    return math.exp(x * math.log(lam) - lam - math.lgamma(x + 1))


def convolve(a, b):
    out = [0.0] * (requests + 1)
    nonzero_b = [(j, w) for j, w in enumerate(b) if w > 1e-300]
    for i, v in enumerate(a):
        if v > 1e-300:
            for j, w in nonzero_b:
                if i + j > requests:
                    break
                out[i + j] += v * w
    return out


def p_max_at_most(m):
    """P(every engine's count <= m)."""
    one = [poisson(x, mean) if x <= m else 0.0 for x in range(requests + 1)]
    total = one
    for _ in range(engines - 1):
        total = convolve(total, one)
    return total[requests] / poisson(requests, requests)


for printed in ["1.00", "1.01", "1.02", "1.03", "1.05"]:
    # The largest count that still prints as `printed` (rounded to two decimals).
    m = math.floor((float(printed) + 0.005) * mean - 1e-9)
    print(f"P(imbalance prints <= {printed}, max <= {m}) = {p_max_at_most(m):.4f}")


def bounded_by_count(seed, margin, groups=32):
    rng = random.Random(seed)
    counts, groups_on, holders, replicas = [0] * engines, [0] * engines, {}, 0
    for i in range(requests):
        group = rng.randrange(groups)
        if group not in holders:
            e = min(range(engines), key=lambda e: (groups_on[e], counts[e]))
            holders[group] = [e]
            groups_on[e] += 1
        else:
            e = min(holders[group], key=lambda e: counts[e])
            so_far_mean = (i + 1) / engines
            low = min(range(engines), key=lambda e: counts[e])
            if counts[e] + 1 > so_far_mean + margin and counts[low] < so_far_mean:
                if low not in holders[group]:
                    holders[group].append(low)
                    replicas += 1
                e = low
        counts[e] += 1
    return max(counts) / mean, replicas


seeds = 200
for margin in [8, 16, 32]:
    runs = [bounded_by_count(seed, margin) for seed in range(seeds)]
    imbalances = sorted(r[0] for r in runs)
    replicas = sorted(r[1] for r in runs)
    ones = sum(x < 1.005 for x in imbalances) / seeds
    print(f"count model, margin {margin}: prints 1.00 in {ones:.0%} of {seeds} seeds; "
          f"imbalance median {imbalances[seeds // 2]:.4f}, worst {imbalances[-1]:.4f}; "
          f"replicas median {replicas[seeds // 2]}, most {replicas[-1]}")


def bounded_rule(seed, bound, holder_pick, stale=0, groups=32):
    rng = random.Random(seed)
    counts, groups_on, holders, replicas, recent = [0] * engines, [0] * engines, {}, 0, []
    for i in range(requests):
        group = rng.randrange(groups)
        seen = list(counts)
        for e in recent:
            seen[e] -= 1
        limit = bound(sum(seen) / engines)
        if group not in holders:
            e = min(range(engines), key=lambda e: (groups_on[e], seen[e]))
            holders[group] = [e]
            groups_on[e] += 1
        else:
            within = [h for h in holders[group] if seen[h] + 1 <= limit]
            if within:
                if holder_pick == "least-sent":
                    e = min(within, key=lambda h: seen[h])
                else:
                    e = rng.choice(within)
            else:
                e = min(range(engines), key=lambda e: seen[e])
                if e not in holders[group]:
                    holders[group].append(e)
                    replicas += 1
        counts[e] += 1
        recent = (recent + [e])[-stale:] if stale else []
    return max(counts) / mean, replicas


rule_seeds = 100
bounds = [("mean + 2", lambda m: m + 2), ("mean + 4", lambda m: m + 4),
          ("mean + 8", lambda m: m + 8), ("ceil(mean * 1.005)", lambda m: math.ceil(m * 1.005))]
for name, bound in bounds:
    for pick in ["least-sent", "uniform"]:
        for stale in [0, 2]:
            runs = [bounded_rule(seed, bound, pick, stale) for seed in range(rule_seeds)]
            imbalances = sorted(r[0] for r in runs)
            replicas = sorted(r[1] for r in runs)
            ones = sum(x < 1.005 for x in imbalances) / rule_seeds
            print(f"bound {name}, {pick} holder, stale {stale}: prints 1.00 in {ones:.0%} of "
                  f"{rule_seeds} seeds; worst {imbalances[-1]:.4f}; replicas median "
                  f"{replicas[rule_seeds // 2]}, most {replicas[-1]}")

print_with_caches()
