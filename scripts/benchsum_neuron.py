#!/usr/bin/env python3
"""bench-p2p.sh's Neuron table of one provider: the Neuron plugin (neuron_bench over
libnccom-net.so's ncclNetPlugin_v6) next to raw libfabric, medians over the repetitions.

    benchsum_neuron.py SAMPLES

SAMPLES lines are "SIZE METRIC VALUE", METRIC = WHO_OP_KIND:
  WHO  fp (fi_pingpong, op send), rr (rma_raw: write, read), nb (neuron_bench: send, write,
       read, inline)
  KIND lat (us: one-way for send, one op in flight for RMA), pp (GB/s, send: size / one-way
       latency), bw (GB/s: send streaming / RMA with a window of ops in flight)
Rows per size: send (ping-pong, like for like with fi_pingpong), send_st (neuron streaming
against fi_pingpong's ping-pong bandwidth, as the NCCL table's st_x), write, read, inline
(iwriteInline against rma_raw's fi_write of the same size). Then the targets: bw_x >= 0.9
from 1 MiB and lat_x <= 1.2 at 8 B, by medians and by the best run of each side (lowest latency,
highest bandwidth), which a shared machine disturbs least. Standard library only.
"""
import sys

from benchsum import fmt, median, num, read_lines

BW_TARGET, BW_FROM, LAT_TARGET, LAT_AT = 0.9, 1 << 20, 1.2, 8

# op shown -> (raw who, raw op, raw bandwidth kind, neuron op, neuron bandwidth kind)
ROWS = [
    ("send", "fp", "send", "pp", "send", "pp"),
    ("send_st", "fp", "send", "pp", "send", "bw"),
    ("write", "rr", "write", "bw", "write", "bw"),
    ("read", "rr", "read", "bw", "read", "bw"),
    ("inline", "rr", "write", "bw", "inline", "bw"),
]


def medians(samples):
    """{(size, metric): (median, count, best)}; best: the lowest latency, the highest bandwidth."""
    values = {}
    for f in samples:
        if len(f) >= 3:
            values.setdefault((int(num(f[0])), f[1]), []).append(num(f[2]))
    return {k: (median(sorted(v)), len(v), min(v) if k[1].endswith("_lat") else max(v))
            for k, v in values.items()}


def table(samples):
    """The table's lines and, per op, the target tallies."""
    med = medians(samples)

    def get(size, metric, which=0):
        v = med.get((size, metric))
        return None if v is None else v[which]

    def ratio(a, b):
        return None if a is None or not b else a / b

    head = "%10s %8s %10s %10s %6s %10s %10s %6s %5s"
    out = [head % ("size(B)", "op", "raw_lat", "nrn_lat", "lat_x", "raw_bw", "nrn_bw", "bw_x", "n"),
           head % ("", "", "us", "us", "", "GB/s", "GB/s", "", "r/n")]
    sizes = sorted({k[0] for k in med})
    bw_hits, lat_at = {}, {}
    for s in sizes:
        for op, rw, rop, rkind, nop, nkind in ROWS:
            nl, nb = get(s, f"nb_{nop}_lat"), get(s, f"nb_{nop}_{nkind}")
            rl, rb = get(s, f"{rw}_{rop}_lat"), get(s, f"{rw}_{rop}_{rkind}")
            # raw rows stand alone (a failed neuron run); the derived rows need the neuron side
            if (nl is None and nb is None) and (op in ("send_st", "inline") or (rl is None and rb is None)):
                continue
            lat_x = None if op == "send_st" or nl is None or not rl else nl / rl
            bw_x = None if nb is None or not rb else nb / rb
            count = f"{med.get((s, f'{rw}_{rop}_lat'), (0, 0))[1]}/{med.get((s, f'nb_{nop}_lat'), (0, 0))[1]}"
            out.append(head.replace("%10s", "%10d", 1) % (
                s, op, fmt(None if op == "send_st" else rl, ".2f"), fmt(None if op == "send_st" else nl, ".2f"),
                fmt(lat_x, ".2f"), fmt(rb, ".4f"), fmt(nb, ".4f"), fmt(bw_x, ".2f"), count))
            best_bw = ratio(get(s, f"nb_{nop}_{nkind}", 2), get(s, f"{rw}_{rop}_{rkind}", 2))
            if s >= BW_FROM and bw_x is not None:
                t = bw_hits.setdefault(op, [0, 0, None, 0])
                t[0] += bw_x >= BW_TARGET
                t[1] += 1
                t[2] = bw_x if t[2] is None else min(t[2], bw_x)
                t[3] += best_bw is not None and best_bw >= BW_TARGET
            if lat_x is not None and s == LAT_AT:
                lat_at[op] = (lat_x, ratio(get(s, f"nb_{nop}_lat", 2), get(s, f"{rw}_{rop}_lat", 2)))
    return out, bw_hits, lat_at


def targets(bw_hits, lat_at):
    """One line per target: which ops meet it."""
    bw = ", ".join(f"{op} {t[0]}/{t[1]} (worst {t[2]:.2f}; best runs {t[3]}/{t[1]})" for op, t in bw_hits.items())
    lat = ", ".join(f"{op} {x:.2f}{'' if x <= LAT_TARGET else ' OVER'} (best runs {b:.2f})"
                    for op, (x, b) in lat_at.items())
    bw = bw or "no sizes >= 1 MiB"
    return [f"## target bw_x >= {BW_TARGET} from 1 MiB (sizes meeting it): {bw}",
            f"## target lat_x <= {LAT_TARGET} at {LAT_AT} B: {lat or f'no {LAT_AT} B latency pairs'}"]


def main(argv):
    if len(argv) != 2:
        print(__doc__.strip().splitlines()[2].strip(), file=sys.stderr)
        return 2
    lines, bw_hits, lat_at = table(read_lines(argv[1]))
    if len(lines) == 2:
        print("## (no samples)")
        return 0
    for line in lines + targets(bw_hits, lat_at):
        print(line)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
