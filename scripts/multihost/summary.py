#!/usr/bin/env python3
"""Tables of the multi-host benchmark (scripts/bench-multihost.sh) from its samples.jsonl.

    summary.py DIR/samples.jsonl

Per layout, delay and collective, one row per size, from the medians over the repetitions:
auto's time, the best forced algorithm's (and its name), auto / best forced (the target: at most
1.10), Open MPI's time, our busbw / Open MPI's (auto's busbw; the target: at least 1.0 from
64 KiB, and a time within 1.5x of Open MPI's at the smallest size), and where measured (2x2)
one fabric / two fabrics: auto over net alone (FABRICOLL_INTRA_PROVIDER=same) against auto with
shm within hosts (above 1: two fabrics are faster). The last lines count the points that meet
each target.
"""
import json
import statistics
import sys
from collections import defaultdict


def read_samples(path):
    """The rows of a samples.jsonl, one dict each (blank lines skipped)."""
    with open(path, encoding="utf-8") as f:
        for line in f:
            line = line.strip()
            if line:
                yield json.loads(line)


def load(path):
    """{(layout, delay, coll): {size: {tool: [(time_us, busbw) per rep]}}}"""
    data = defaultdict(lambda: defaultdict(lambda: defaultdict(list)))
    for s in read_samples(path):
        if "pair" in s:
            continue  # bench.py --compress's rows: compress_summary.py's tables
        data[(s["layout"], s["delay"], s["coll"])][s["size"]][s["tool"]].append(
            (s["time_us"], s["busbw"]))
    return data


def med(samples, i):
    return statistics.median(x[i] for x in samples)


def ratio(a, b):
    return f"{a / b:.2f}" if a is not None and b else "-"


def fmt_us(t):
    return "-" if t is None else f"{t:.1f}"


def table(key, sizes, counts):
    """Prints one table; adds to `counts` the points meeting each target."""
    layout, delay, coll = key
    print(f"\n## {layout}, delay {delay}, {coll}")
    print(f"{'size':>10} {'auto us':>10} {'best forced':>22} {'auto/best':>9} {'ompi us':>10} "
          f"{'busbw/ompi':>10} {'same/two':>8}")
    first = True
    for size in sorted(sizes):
        tools = sizes[size]
        auto = med(tools["auto"], 0) if tools.get("auto") else None
        forced = {t[5:]: med(v, 0) for t, v in tools.items() if t.startswith("algo:") and v}
        best = min(forced, key=forced.get) if forced else None
        best_t = forced[best] if best else None
        ompi = med(tools["ompi"], 0) if tools.get("ompi") else None
        bw = med(tools["auto"], 1) if tools.get("auto") else None
        obw = med(tools["ompi"], 1) if tools.get("ompi") else None
        same = med(tools["auto-same"], 0) if tools.get("auto-same") else None
        best_s = f"{best_t:.1f} {best}" if best else "-"
        print(f"{size:>10} {fmt_us(auto):>10} {best_s:>22} {ratio(auto, best_t):>9} "
              f"{fmt_us(ompi):>10} {ratio(bw, obw):>10} {ratio(same, auto):>8}")
        if auto is not None and best_t:
            counts["auto within 10% of best forced"][0] += auto <= 1.1 * best_t
            counts["auto within 10% of best forced"][1] += 1
        if bw is not None and obw and size >= 64 << 10:
            counts["busbw >= Open MPI's from 64 KiB"][0] += bw >= obw
            counts["busbw >= Open MPI's from 64 KiB"][1] += 1
        if first and auto is not None and ompi:
            counts["smallest size within 1.5x of Open MPI's time"][0] += auto <= 1.5 * ompi
            counts["smallest size within 1.5x of Open MPI's time"][1] += 1
        first = False


def main(argv):
    if len(argv) != 2:
        print(__doc__.split("\n\n")[1], file=sys.stderr)
        return 2
    try:
        data = load(argv[1])
    except (OSError, ValueError, KeyError) as e:
        print(f"summary.py: cannot read {argv[1]}: {e}", file=sys.stderr)
        return 1
    counts = defaultdict(lambda: [0, 0])
    for key in sorted(data):
        table(key, data[key], counts)
    print()
    for what, (ok, n) in counts.items():
        print(f"# target: {what}: {ok} of {n} points")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
