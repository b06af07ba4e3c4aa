#!/usr/bin/env python3
"""ab_table_n.py LOGDIR NAME1 NAME2 ... -- the same-run A/B table of several bench_gemm binaries
(ab_table.sh is the two-binary form used by ab.sh). Reads LOGDIR/<NAME>_<rep>.log, the
bench_gemm logs of each binary's runs, alternated in one session; prints per case (model,
layer, M) the mean of each binary's medians and its ratio to NAME1's, then geomean ratios by M
and overall. Test tooling only."""
import collections
import glob
import math
import sys


def main():
    if len(sys.argv) < 4:
        raise SystemExit(__doc__)
    d, names = sys.argv[1], sys.argv[2:]
    times = collections.defaultdict(lambda: collections.defaultdict(list))
    for n in names:
        for f in sorted(glob.glob(f"{d}/{n}_*.log")):
            for line in open(f):
                w = line.split()
                if w and w[0].startswith("LLaMA"):  # model layer N K M int8% ours_us ...
                    times[(w[0], w[1], int(w[4]))][n].append(float(w[6]))
    print("| case | " + " | ".join(names) + " | " + " | ".join(f"{n}/{names[0]}" for n in names[1:]) + " |")
    logs = collections.defaultdict(list)
    by_m = collections.defaultdict(lambda: collections.defaultdict(list))
    for key in sorted(times):
        mean = {n: sum(v) / len(v) for n, v in times[key].items()}
        if names[0] not in mean:
            continue
        ratios = [mean[n] / mean[names[0]] if n in mean else float("nan") for n in names[1:]]
        for n, r in zip(names[1:], ratios):
            if r == r:
                logs[n].append(math.log(r))
                by_m[key[2]][n].append(math.log(r))
        print(f"| {key[0]} {key[1]} M={key[2]} | " + " | ".join(f"{mean.get(n, float('nan')):.2f}" for n in names)
              + " | " + " | ".join(f"{r:.3f}" for r in ratios) + " |")
    gm = lambda v: math.exp(sum(v) / len(v))
    for m in sorted(by_m):
        print(f"M={m}: " + "  ".join(f"{n} {gm(v):.3f}" for n, v in by_m[m].items()))
    print("geomean: " + "  ".join(f"{n} {gm(v):.4f}" for n, v in logs.items()))


if __name__ == "__main__":
    main()
