"""A synthetic result directory of scripts/bench-coll.sh (samples.txt, modes.txt, busy.txt), the
same every time, with the cases the summary must handle: even and odd numbers of repetitions,
a size only one tool reports, several algorithms at one size, runs whose cache mode changed or
is unknown, and a table with no common size."""
import os
import random

# The settings to summarize it with (BENCH_COLLS, BENCH_RANKS, BENCH_TRANSPORTS).
COLLS, RANKS, TRANSPORTS = "allreduce allgather", "2 4", "shm tcp"


def write(out):
    rnd = random.Random(28)
    os.makedirs(out, exist_ok=True)
    samples, modes = [], []
    tables = [(c, r, tr) for tr in TRANSPORTS.split() for r in (2, 4) for c in COLLS.split()]
    reps = 5
    for c, r, tr in tables:
        for rep in range(1, reps + 1):
            for who in ("ours", "ompi"):
                rtt = rnd.choice([30, 31, 62, 75, 310, 345])
                after = rtt if rnd.random() < 0.7 else rnd.choice([62, 340, "-"])
                if c == "allgather" and r == 4 and tr == "tcp" and rep == 2:
                    after = "-"
                modes.append(f"{c} {r} {tr} {who} {rep} {rtt} {after}")
                sizes = [8 * 4 ** i for i in range(10)]  # 8 B .. 2 MiB
                if c == "allgather" and r == 4 and tr == "tcp":
                    sizes = sizes[1:] if who == "ours" else sizes[:1]  # no common size
                for s in sizes:
                    if who == "ompi" and s == 8 and c == "allgather" and r == 2:
                        continue  # only ours reports 8 B here
                    if rep == 5 and s == 2048:
                        continue  # one repetition short: an even count of samples
                    t = round(3 + s / (2e3 if who == "ours" else 2.2e3) * rnd.uniform(0.7, 1.6), 2)
                    bw = round(s / t / 1e3 * (1.5 if c == "allreduce" else 0.5), 3)
                    k = f"{c} {r} {tr} {s}"
                    samples.append(f"{k} {who} time {t} {rep}")
                    samples.append(f"{k} {who} busbw {bw} {rep}")
                    if who == "ours":
                        algo = "ring" if s < 32768 or rep % 2 else "rdh"
                        samples.append(f"{k} algo {algo} 0 {rep}")
    with open(os.path.join(out, "samples.txt"), "w") as f:
        f.write("\n".join(samples) + "\n")
    with open(os.path.join(out, "modes.txt"), "w") as f:
        f.write("\n".join(modes) + "\n")
    with open(os.path.join(out, "busy.txt"), "w") as f:
        f.write("allreduce np2 shm ours 3\n")


if __name__ == "__main__":
    import sys
    write(sys.argv[1])


def collnet_samples():
    """samples.txt lines of bench-collnet.sh: RANKS TRANSPORT SIZE WHO METRIC VALUE."""
    rnd = random.Random(12)
    lines = []
    for tr in ("shm", "tcp"):
        for r in (2, 4):
            for rep in range(3 if r == 2 else 4):
                for s in [8 * 8 ** i for i in range(8)]:
                    if tr == "tcp" and s == 8 and rep == 0:
                        continue
                    t = round(4 + s / 1.5e3 * rnd.uniform(0.8, 1.4), 2)
                    lines.append(f"{r} {tr} {s} native time {t}")
                    lines.append(f"{r} {tr} {s} native busbw {round(s / t / 1e3, 3)}")
                    lines.append(f"{r} {tr} {s} algo {'ring' if s > 4096 or rep else 'rd'} 0")
                    if tr == "shm" and r == 4 and s == 64:
                        continue  # collnet missed this size
                    ct = round(t * rnd.uniform(0.9, 1.3), 2)
                    lines.append(f"{r} {tr} {s} collnet time {ct}")
                    lines.append(f"{r} {tr} {s} collnet busbw {round(s / ct / 1e3, 3)}")
                    if tr == "tcp" and r == 4 and s == 4096 and rep == 1:
                        lines.append(f"{r} {tr} {s} collnet wrong 3")
    return lines


def p2p_samples():
    """<provider>.samples lines of bench-p2p.sh: SIZE METRIC VALUE."""
    rnd = random.Random(3)
    lines = []
    for rep in range(5):
        for s in [8 * 16 ** i for i in range(6)]:
            lat = round(5 + s / 2e3 * rnd.uniform(0.8, 1.3), 2)
            lines.append(f"{s} raw_lat {lat}")
            lines.append(f"{s} raw_pp {round(s / lat, 4)}")
            if rep == 4 and s == 128:
                continue
            pl = round(lat * rnd.uniform(0.9, 1.2), 2)
            lines.append(f"{s} plug_lat {pl}")
            lines.append(f"{s} plug_pp {round(s / pl, 4)}")
            lines.append(f"{s} plug_st {round(s / pl * 1.7, 4)}")
    return lines
