#!/usr/bin/env python3
"""Tables of the compressed collectives' benchmark (scripts/bench-compress.sh) from the
samples.jsonl of `bench.py --compress`.

    compress_summary.py DIR/samples.jsonl [--from BYTES]

Per layout, rate, delay and collective, one row per size: the uncompressed call's median time
and bus bandwidth over every "off" run, then per format its median time and bus bandwidth and
`x`, the median over the repetitions of its bus bandwidth over that of the "off" run it was
paired with (the two ran back to back). Bus bandwidth is counted on the uncompressed size, as
fabricoll-perf reports it, so `x` is the speed-up. The last lines give each format's largest
error (fabricoll-perf's column) and count the points from --from (default 1 MiB) that meet the
targets: x >= 1.8 for bf16 and fp16, x >= 3.0 for the one-byte formats.
"""
import argparse
import os
import statistics
import sys
from collections import defaultdict

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from summary import read_samples  # noqa: E402

# The speed-up each format is expected to reach from the target size on.
TARGETS = {"bf16": 1.8, "fp16": 1.8, "fp8e4m3": 3.0, "fp8e5m2": 3.0, "int8": 3.0}


def load(path):
    """{(layout, rate, delay, coll): {size: [sample, ...]}} of the --compress samples."""
    data = defaultdict(lambda: defaultdict(list))
    for s in read_samples(path):
        if "pair" in s:
            data[(s["layout"], s.get("rate", "-"), s["delay"], s["coll"])][s["size"]].append(s)
    return data


def pair_ratios(samples, fmt):
    """The format's busbw over its paired off run's, one per repetition that has both."""
    by_rep = defaultdict(dict)
    for s in samples:
        if s["pair"] == fmt:
            by_rep[s["rep"]]["off" if s["tool"] == "off" else "on"] = s["busbw"]
    return [r["on"] / r["off"] for r in by_rep.values() if "on" in r and r.get("off")]


def formats_of(data):
    seen = []
    for sizes in data.values():
        for samples in sizes.values():
            for s in samples:
                if s["tool"].startswith("compress:") and s["tool"][9:] not in seen:
                    seen.append(s["tool"][9:])
    order = list(TARGETS)
    return sorted(seen, key=lambda f: order.index(f) if f in order else len(order))


def table(key, sizes, formats, start, counts, worst):
    """Prints one table; adds the points from `start` to `counts`, errors to `worst`."""
    layout, rate, delay, coll = key
    print(f"\n## {layout}, {rate}, delay {delay}, {coll}")
    head = f"{'size':>10} {'off us':>10} {'GB/s':>7}"
    for fmt in formats:
        head += f" | {fmt + ' us':>12} {'GB/s':>7} {'x':>5}"
    print(head)
    for size in sorted(sizes):
        samples = sizes[size]
        off = [s for s in samples if s["tool"] == "off"]
        line = f"{size:>10} "
        if off:
            line += f"{statistics.median(s['time_us'] for s in off):>10.1f} "
            line += f"{statistics.median(s['busbw'] for s in off):>7.3f}"
        else:
            line += f"{'-':>10} {'-':>7}"
        for fmt in formats:
            on = [s for s in samples if s["tool"] == f"compress:{fmt}"]
            ratios = pair_ratios(samples, fmt)
            x = statistics.median(ratios) if ratios else None
            if on:
                line += f" | {statistics.median(s['time_us'] for s in on):>12.1f} "
                line += f"{statistics.median(s['busbw'] for s in on):>7.3f} "
            else:
                line += f" | {'-':>12} {'-':>7} "
            line += f"{x:>5.2f}" if x is not None else f"{'-':>5}"
            for s in on:
                if "error" in s:
                    worst[fmt] = max(worst.get(fmt, 0.0), s["error"])
            if x is not None and size >= start and fmt in TARGETS:
                c = counts[fmt]
                c[0] += x >= TARGETS[fmt]
                c[1] += 1
        print(line)


def main(argv):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n", maxsplit=1)[0])
    p.add_argument("samples")
    p.add_argument("--from", dest="start", type=int, default=1 << 20,
                   help="smallest size that counts for the targets (bytes, default 1 MiB)")
    a = p.parse_args(argv[1:])
    try:
        data = load(a.samples)
    except (OSError, ValueError, KeyError) as e:
        print(f"compress_summary.py: cannot read {a.samples}: {e}", file=sys.stderr)
        return 1
    if not data:
        print(f"compress_summary.py: {a.samples} holds no --compress samples", file=sys.stderr)
        return 1
    formats = formats_of(data)
    counts = defaultdict(lambda: [0, 0])
    worst = {}
    for key in sorted(data):
        table(key, data[key], formats, a.start, counts, worst)
    print()
    for fmt in formats:
        if fmt in worst:
            print(f"# {fmt}: largest error (max |compressed - uncompressed| / amax) "
                  f"{worst[fmt]:.3e}")
    for fmt in formats:
        if fmt in counts:
            ok, n = counts[fmt]
            print(f"# target: {fmt} x >= {TARGETS[fmt]} from {a.start} B: {ok} of {n} points")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
