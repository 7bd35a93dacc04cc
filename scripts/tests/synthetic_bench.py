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
