#!/usr/bin/env python3
"""Summary tables of the benchmarks: medians over repetitions, ratios, targets.

    benchsum.py coll DIR --algo A --colls "C..." --ranks "R..." --transports "T..." [--t0 SECS]
    benchsum.py collnet SAMPLES --ranks R --transport T     (bench-collnet.sh, one table)
    benchsum.py p2p SAMPLES                                 (bench-p2p.sh, one provider's table)
    benchsum.py ab ROWS                                     (bench-ab.sh, two builds side by side)

coll: bench-coll.sh's summary (fabricoll-perf next to Open MPI), from its result directory
(samples.txt, modes.txt and busy.txt as bench-coll.sh writes them); it
prints, per transport / rank count / collective, the per-size medians over the repetitions
(busbw and time of both tools, bw_x = ours/OMPI), the median of the ratios within each
repetition (pair_x), the same over the repetitions whose two runs ran in one cache mode (mode_x,
nm of them), a "target[...]" line per table and a "# target, <transport>" total per transport
(bench-coll.sh's header says what each means and why). DIR/targets.txt gets one line per table.

Input lines (one run writes several):
  samples.txt  COLL RANKS TRANSPORT SIZE WHO METRIC VALUE REP  (WHO ours|ompi, METRIC time|busbw)
               COLL RANKS TRANSPORT SIZE algo NAME 0 REP       (the algorithm ours chose)
  modes.txt    COLL RANKS TRANSPORT WHO REP RTT_BEFORE RTT_AFTER  (ns, or "-")
Standard library only.
"""
import argparse
import os
import sys
import time


def median(values):
    """The median of a sorted, non-empty list (the mean of the middle two for an even count)."""
    n = len(values)
    return values[(n - 1) // 2] if n % 2 else (values[n // 2 - 1] + values[n // 2]) / 2


def num(s):
    """A field as awk reads it as a number (its leading number; 0 if none)."""
    try:
        return float(s)
    except ValueError:
        digits = ""
        for ch in s.strip():
            if ch.isdigit() or ch in ".-+eE" and not (ch in "-+" and digits):
                digits += ch
            else:
                break
        try:
            return float(digits)
        except ValueError:
            return 0.0


def awk_str(x):
    """A number as awk's print writes it (integers whole, else %.6g)."""
    return str(int(x)) if x == int(x) else f"{x:.6g}"


def rtt_classes(mode_lines):
    """The classes of round trips, "LO-HI" each, ascending: sorted, a value more than 1.5 times
    the one before starts a new class."""
    values = sorted(num(v) for line in mode_lines for v in line.split()[5:7] if v != "-")
    classes, lo, prev = [], None, None
    for v in values:
        if lo is None:
            lo = v
        elif v > 1.5 * prev:
            classes.append(f"{awk_str(lo)}-{awk_str(prev)}")
            lo = v
        prev = v
    if lo is not None:
        classes.append(f"{awk_str(lo)}-{awk_str(prev)}")
    return classes


def run_mode(before, after, classes):
    """The class "LO-HI ns" holding both round trips, "changed" if they fall into two, "-" if
    either is unknown."""
    if before == "-" or after == "-" or not classes:
        return "-"

    def cls(v):
        for c in classes:
            if num(v) <= num(c.split("-", 1)[1]):
                return c
        return ""

    a, b = cls(before), cls(after)
    return f"{a} ns" if a == b else "changed"


def ratio(a, b):
    return "-" if a is None or b is None or b == 0 else f"{a / b:.2f}"


def fmt(x, spec):
    return "-" if x is None else format(x, spec)


class Table:
    """The samples of one collective / rank count / transport."""

    def __init__(self, samples, modes, classes):
        self.med, self.cnt, self.per, self.reps, self.algos = {}, {}, {}, set(), {}
        values = {}
        for f in samples:
            size = int(num(f[3]))
            if f[4] == "algo":
                names = self.algos.setdefault(size, [])
                if f[5] not in names:
                    names.append(f[5])
                continue
            values.setdefault((size, f[4], f[5]), []).append(num(f[6]))
            if len(f) >= 8:
                self.per[(size, f[4], f[5], f[7])] = num(f[6])
                self.reps.add(f[7])
        for k, v in values.items():
            v.sort()
            self.med[k], self.cnt[k] = median(v), len(v)
        for names in self.algos.values():
            names.sort()
        self.sizes = sorted({k[0] for k in values})
        self.runmode = {(m[3], m[4]): run_mode(m[5], m[6], classes) for m in modes}

    def pair(self, size, metric, same):
        """The median over repetitions of ours/OMPI within one repetition (the two ran one after
        the other), with `same` only over those whose two runs ran in one cache mode; and how
        many repetitions it took."""
        x = []
        for rep in self.reps:
            mode = self.runmode.get(("ours", rep), "")
            if same and not (mode.endswith("ns") and self.runmode.get(("ompi", rep)) == mode):
                continue
            ours = self.per.get((size, "ours", metric, rep))
            ompi = self.per.get((size, "ompi", metric, rep))
            if ours is not None and ompi is not None and ompi > 0:
                x.append(ours / ompi)
        if not x:
            return "-", 0
        return f"{median(sorted(x)):.2f}", len(x)


def summarize(out, c, r, tr, table, done_reps, algo, targets):
    """The table of medians of one collective / rank count / transport."""
    where = "shm" if tr == "shm" else f"{tr}, FABRICOLL_DOMAIN=lo"
    ompi = "btl self,vader" if tr == "shm" else "btl self,tcp on lo"
    out.append("")
    out.append(f"## {c}, {r} ranks, {tr}: medians over {done_reps} repetition(s); ours = "
               f"fabricoll-perf --algo {algo} ({where}), OMPI = {ompi}")
    out.append("%10s %10s %10s %7s %7s %7s %3s %11s %11s %7s %5s  %s" % (
        "size(B)", "ours", "OMPI", "bw_x", "pair_x", "mode_x", "nm", "ours", "OMPI", "t_x", "n",
        "our algo"))
    out.append("%10s %10s %10s %7s %7s %7s %3s %11s %11s %7s %5s" % (
        "", "busbw GB/s", "busbw GB/s", "ours/OMPI", "same rep", "same", "", "time us", "time us",
        "ours/OMPI", "o/m"))
    med = table.med
    first = None
    big = won = pwon = mwon = mbig = 0
    for s in table.sizes:
        ob, mb = med.get((s, "ours", "busbw")), med.get((s, "ompi", "busbw"))
        ot, mt = med.get((s, "ours", "time")), med.get((s, "ompi", "time"))
        if first is None and ot is not None and mt is not None:
            first = s
        bx = ratio(ob, mb)
        px, _ = table.pair(s, "busbw", False)
        mx, nm = table.pair(s, "busbw", True)
        if s >= 65536 and bx != "-":  # the ratio as printed
            big += 1
            won += float(bx) >= 1
            pwon += px != "-" and float(px) >= 1
            if mx != "-":
                mbig += 1
                mwon += float(mx) >= 1
        counts = f"{table.cnt.get((s, 'ours', 'time'), 0)}/{table.cnt.get((s, 'ompi', 'time'), 0)}"
        out.append("%10d %10s %10s %7s %7s %7s %3d %11s %11s %7s %5s  %s" % (
            s, fmt(ob, ".3f"), fmt(mb, ".3f"), bx, px, mx, nm, fmt(ot, ".2f"), fmt(mt, ".2f"),
            ratio(ot, mt), counts, ",".join(table.algos.get(s, []))))
    if first is None:
        out.append("   (no size reported by both)")
        return
    ot, mt = med[(first, "ours", "time")], med[(first, "ompi", "time")]
    tx = f"{ot / mt:.2f}"
    ptx, _ = table.pair(first, "time", False)
    mtx, _ = table.pair(first, "time", True)
    out.append(f"   smallest common size {first} B: median time ours {ot:.2f} us, "
               f"OMPI {mt:.2f} us, time ratio ours/OMPI {tx} (within repetitions {ptx}, "
               f"same mode {mtx})")
    out.append(f"   target[{tr}]: bw_x >= 1.00 in {won}/{big} sizes from 64 KiB, pair_x in {pwon}, "
               f"mode_x in {mwon} of the {mbig} with a same-mode pair; smallest size time ratio "
               f"{tx}, pairs {ptx}, same mode {mtx}")
    targets.append((tr, won, big, pwon, tx, ptx, mwon, mtx, mbig))


def target_totals(targets):
    """The target per transport: busbw at least Open MPI's from 64 KiB, and the time at
    the smallest size within 1.5 times Open MPI's."""
    totals = {}
    for tr, won, big, pwon, tx, ptx, mwon, mtx, mbig in targets:
        t = totals.setdefault(tr, [0] * 10)
        for i, v in enumerate((won, big, pwon, mwon, mbig, 1, float(tx) <= 1.5,
                               ptx != "-" and float(ptx) <= 1.5, mtx != "-" and float(mtx) <= 1.5,
                               mtx != "-")):
            t[i] += v
    return [f"# target, {tr}: bw_x >= 1.00 in {t[0]}/{t[1]} sizes from 64 KiB (pair_x: {t[2]}, "
            f"mode_x: {t[3]}/{t[4]} with a same-mode pair); smallest size within 1.5x in "
            f"{t[6]}/{t[5]} rows (pairs: {t[7]}, same mode: {t[8]}/{t[9]})"
            for tr, t in totals.items()]


def medians(rows):
    """{key: (median, count)} of (key, value) pairs."""
    values = {}
    for k, v in rows:
        values.setdefault(k, []).append(v)
    return {k: (median(sorted(v)), len(v)) for k, v in values.items()}


def collnet_table(samples, ranks, transport):
    """bench-collnet.sh's table of one rank count and transport: per size, the median time and
    busbw of CollNet and native runs, their time ratio (marked "over" above 1.1 from 64 KiB) and
    the wrong results CollNet reported. `samples`: RANKS TRANSPORT SIZE WHO METRIC VALUE lines."""
    rows = [f for f in samples if f[:2] == [ranks, transport]]
    algos, wrong, pairs = {}, {}, []
    for f in rows:
        size = int(num(f[2]))
        if f[3] == "algo":
            algos.setdefault(size, set()).add(f[4])
        elif f[4] == "wrong":
            wrong[size] = wrong.get(size, 0) + num(f[5])
        else:
            pairs.append(((size, f[3], f[4]), num(f[5])))
    med = medians(pairs)
    m = {k: v[0] for k, v in med.items()}
    out = ["%10s %11s %11s %8s %10s %10s %5s  %s" % ("size(B)", "collnet", "native", "t_ratio",
                                                      "collnet", "native", "n", "native algo"),
           "%10s %11s %11s %8s %10s %10s %5s" % ("", "time us", "time us", "cn/nat", "busbw GB/s",
                                                  "busbw GB/s", "c/n")]
    over, worst = 0, 0.0
    for s in sorted({k[0] for k in med}):
        ct, nt = m.get((s, "collnet", "time")), m.get((s, "native", "time"))
        cb, nb = m.get((s, "collnet", "busbw")), m.get((s, "native", "busbw"))
        r = None if ct is None or nt is None or nt == 0 else ct / nt
        mark = ""
        if r is not None and s >= 65536 and r > 1.1:
            mark = "  over"
            over += 1
        if r is not None and r > worst:
            worst = r
        if wrong.get(s, 0) > 0:
            mark += f"  WRONG RESULTS ({awk_str(wrong[s])})"
        cn, nat = med.get((s, "collnet", "time"), (0, 0)), med.get((s, "native", "time"), (0, 0))
        n = f"{cn[1]}/{nat[1]}"
        out.append("%10d %11s %11s %8s %10s %10s %5s  %s%s" % (
            s, fmt(ct, ".2f"), fmt(nt, ".2f"), fmt(r, ".2f"), fmt(cb, ".3f"), fmt(nb, ".3f"), n,
            ",".join(sorted(algos.get(s, ()))), mark))
    out.append(f"   {over} size(s) >= 64 KiB above the target ratio 1.1; worst ratio {worst:.2f}")
    return out


def p2p_table(samples):
    """bench-p2p.sh's table of one provider: per size, the median one-way latency and ping-pong
    MB/s of raw libfabric and the plugin, the plugin's stream MB/s, and their ratios.
    `samples`: SIZE METRIC VALUE lines."""
    med = medians(((int(num(f[0])), f[1]), num(f[2])) for f in samples)
    m = {k: v[0] for k, v in med.items()}

    def mb(x):
        return "-" if x is None else format(x, ".3f" if x < 10 else ".2f" if x < 100 else ".1f")

    head = "%10s %10s %10s %7s %10s %10s %7s %10s %7s %5s"
    out = [head % ("size(B)", "raw_lat", "plug_lat", "lat_x", "raw_pp", "plug_pp", "pp_x",
                   "plug_st", "st_x", "n"),
           head % ("", "us", "us", "", "MB/s", "MB/s", "", "MB/s", "", "r/p")]
    for s in sorted({k[0] for k in med}):
        rl, pl, rp = m.get((s, "raw_lat")), m.get((s, "plug_lat")), m.get((s, "raw_pp"))
        pp, st = m.get((s, "plug_pp")), m.get((s, "plug_st"))
        n = f"{med.get((s, 'raw_lat'), (0, 0))[1]}/{med.get((s, 'plug_lat'), (0, 0))[1]}"
        out.append(head.replace("%10s", "%10d", 1) % (
            s, fmt(rl, ".2f"), fmt(pl, ".2f"), ratio(pl, rl), mb(rp), mb(pp), ratio(pp, rp),
            mb(st), ratio(st, rp), n))
    return out + streams_table(m)


def streams_table(m):
    """The plugin's streaming MB/s against plain TCP streams (tcp_streams -k K, metric tcpK_st):
    per size, each K's median, the best K, and for the plugin (plug_st) and each
    FABRICOLL_NET_STREAMS variant (plugsN_st) its ratio to the best K (x_best) and to one stream
    (x_1). Empty where no tcpK_st sample exists. `m`: (size, metric) -> median."""
    ks = sorted({int(k[1][3:-3]) for k in m if k[1].startswith("tcp") and k[1].endswith("_st")})
    if not ks:
        return []
    plugs = ["plug"] if any(k[1] == "plug_st" for k in m) else []
    plugs += [f"plugs{n}" for n in sorted({int(k[1][5:-3]) for k in m
                                            if k[1].startswith("plugs") and k[1].endswith("_st")})]
    cols = [f"tcp{k}" for k in ks] + ["best"]
    head = "%10s" + " %9s" * len(cols) + "".join(" | %9s %6s %6s" for _ in plugs)
    names = ["size(B)"] + cols
    for p in plugs:
        names += [p, "x_best", "x_1"]
    out = ["", "## streams: stream MB/s (1e6 B/s) of K plain TCP sockets (tcpK) and of the plugin; "
           "x_best = plugin / best K, x_1 = plugin / tcp1", head % tuple(names)]
    for s in sorted({k[0] for k in m if k[1].endswith("_st")}):
        vals = [m.get((s, f"tcp{k}_st")) for k in ks]
        known = [(v, k) for v, k in zip(vals, ks) if v is not None]
        best = max(known)[0] if known else None
        best_k = f"{best:.0f}/k{max(known)[1]}" if known else "-"
        row = [str(s)] + [fmt(v, ".0f") for v in vals] + [best_k]
        for p in plugs:
            v = m.get((s, f"{p}_st"))
            row += [fmt(v, ".0f"), ratio(v, best), ratio(v, m.get((s, "tcp1_st")))]
        out.append(head % tuple(row))
    return out


def read_lines(path):
    try:
        with open(path, encoding="utf-8") as f:
            return [line.split() for line in f if line.strip()]
    except FileNotFoundError:
        return []


def coll_summary(d, algo, colls, ranks, transports, t0=None, reps=None):
    """The lines bench-coll.sh prints after its runs (and writes to DIR/summary.txt); `reps`:
    the repetitions done (default: the highest in samples.txt)."""
    d = d.rstrip("/")
    samples = read_lines(os.path.join(d, "samples.txt"))
    modes = read_lines(os.path.join(d, "modes.txt"))
    busy = read_lines(os.path.join(d, "busy.txt"))
    done_reps = reps if reps is not None else max(
        (int(num(f[7])) for f in samples if len(f) >= 8), default=0)
    out = ["", "# busbw: higher is better (bw_x > 1: ours faster); time: lower is better "
           "(t_x < 1: ours faster).",
           "# time = per-iteration mean, averaged over ranks in both tools."]
    if busy:
        out.append(f"# WARNING: {len(busy)} run(s) started on a busy machine (wait-quiet gave up); "
                   f"see {d}/busy.txt")
    classes = rtt_classes([" ".join(m) for m in modes])
    count = {}
    for m in modes:
        k = run_mode(m[5], m[6], classes)
        count[k] = count.get(k, 0) + 1
    line = "# cache modes (fabricoll-info --core-rtt 0 1 before and after each run), runs per mode:"
    for c in classes:
        line += f" {c} ns: {count.get(c + ' ns', 0)},"
    out.append(line + f" changed during the run: {count.get('changed', 0)}, "
               f"unknown: {count.get('-', 0)}")
    targets = []
    for tr in transports:
        for r in ranks:
            for c in colls:
                key = [c, r, tr]
                table = Table([f for f in samples if f[:3] == key],
                              [m for m in modes if m[:3] == key], classes)
                summarize(out, c, r, tr, table, done_reps, algo, targets)
    with open(os.path.join(d, "targets.txt"), "w", encoding="utf-8") as f:
        f.writelines(" ".join(str(int(v) if isinstance(v, bool) else v) for v in t) + "\n"
                     for t in targets)
    out.append("")
    out.extend(target_totals(targets))
    elapsed = int(time.time() - t0) if t0 is not None else 0
    out.append(f"# total {elapsed} s; raw logs: {d}/")
    return out


def ab_table(lines):
    """bench-ab.sh's table: per transport, rank count, collective and size, the median time of
    builds A and B and the median of the per-repetition ratios B/A (below 1: B is faster).
    Input rows (fields, as read_lines gives them): LABEL TRANSPORT RANKS COLL BYTES REP TIME_US
    (LABEL A or B)."""
    cells = {}
    for f in lines:
        if len(f) != 7 or f[0] not in ("A", "B"):
            continue
        key = (f[1], int(f[2]), f[3], int(f[4]))
        cells.setdefault(key, {}).setdefault(f[5], {})[f[0]] = num(f[6])
    out = [f"{'transport':9} {'ranks':>5} {'collective':14} {'bytes':>9} "
           f"{'A us':>10} {'B us':>10} {'B/A':>6} {'n':>2}"]
    for key in sorted(cells):
        reps = cells[key].values()
        a = sorted(r["A"] for r in reps if "A" in r)
        b = sorted(r["B"] for r in reps if "B" in r)
        ratios = sorted(r["B"] / r["A"] for r in reps if "A" in r and "B" in r and r["A"] > 0)
        if not ratios:
            continue
        out.append(f"{key[0]:9} {key[1]:5} {key[2]:14} {key[3]:9} {median(a):10.2f} "
                   f"{median(b):10.2f} {median(ratios):6.3f} {len(ratios):2}")
    return out


def main(argv):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = p.add_subparsers(dest="what", required=True)
    c = sub.add_parser("coll", help="bench-coll.sh's tables")
    c.add_argument("dir")
    c.add_argument("--algo", default="auto")
    c.add_argument("--colls", default="allreduce allgather reducescatter")
    c.add_argument("--ranks", default="2 4")
    c.add_argument("--transports", default="shm tcp net")
    c.add_argument("--t0", type=float, help="start time (epoch seconds) for the total line")
    c.add_argument("--reps", type=int, help="repetitions done (default: the highest sampled)")
    cn = sub.add_parser("collnet", help="bench-collnet.sh's table of one rank count and transport")
    cn.add_argument("samples")
    cn.add_argument("--ranks", required=True)
    cn.add_argument("--transport", required=True)
    pp = sub.add_parser("p2p", help="bench-p2p.sh's table of one provider")
    pp.add_argument("samples")
    ab = sub.add_parser("ab", help="bench-ab.sh's table of two builds")
    ab.add_argument("rows")
    a = p.parse_args(argv)
    if a.what == "ab":
        lines = ab_table(read_lines(a.rows))
    elif a.what == "collnet":
        lines = collnet_table(read_lines(a.samples), a.ranks, a.transport)
    elif a.what == "p2p":
        lines = p2p_table(read_lines(a.samples))
    else:
        lines = coll_summary(a.dir, a.algo, a.colls.split(), a.ranks.split(),
                             a.transports.split(), a.t0, a.reps)
    sys.stdout.write("\n".join(lines) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
