#!/usr/bin/env python3
"""The simulator against the emulated hosts (scripts/sim-validate.sh): fabricoll-sim's predicted
time of each forced algorithm and size beside the time measured on the same layout, link rate and
delay, and the prediction error |sim - measured| / measured.

    simval.py --dir DIR [--sim target/release/fabricoll-sim] [--out FILE]
              [--payload-fraction 0.9564] [--from 64K] [--no-burst] [--calls 4]

DIR holds one folder per link rate (DIR/1gbit, DIR/10gbit), each a scripts/bench-multihost.sh
run with --calibrate: samples.jsonl (the measured rows; tools algo:<name>) and
calibrations.jsonl (the calibration lines). Measured time: the median over the repetitions of
fabricoll-perf's time (the mean over ranks of the mean per iteration).

What fabricoll-sim is told, and where each figure comes from:
  --hosts         the layout the ranks ran on
  --gbit          the tbf rate shaped on every host link, times --payload-fraction: tbf counts
                  whole frames, so a TCP stream over 1500-byte frames carries 1448 bytes of
                  payload per 1514 counted (IP and TCP headers with timestamps, Ethernet header)
  --alpha-us      the one-way delay shaped (the NFQUEUE delayer) plus the rest of a message's
                  latency: the calibration's inter alpha (half a 4-byte ping-pong's round trip)
                  minus the shaped delay, the median over the calibrations of that layout and
                  delay (undisturbed ones where there are); so alpha is what a small message
                  took at that delay, whatever besides the delay it waited for
  --o-us          the calibration's inter o (the sender's CPU per message)
  --intra-*       the calibration's intra level: alpha, beta (GB/s), o
  --gamma-gbps    the calibration's gamma
  --burst         tbf's bucket on each direction of every host link (scripts/netns-cluster.sh's
                  tc_sizes: a millisecond of the rate, at least 128 KiB), times
                  --payload-fraction: after a pause a link passes that much at once. A NIC's
                  wire has no bucket; the emulated link has, and a tree's hops, which leave
                  links idle between them, owe up to half their time to it. --no-burst leaves
                  it out
  --burst-gbps    the speed of those bytes: PEAK_GBPS, what an unshaped pair of emulated hosts
                  carries
  --calls         CALLS calls back to back, as fabricoll-perf's loop runs them: the time per
                  call of the loop's steady state, where a call starts on links (and buckets)
                  the last one left
The calibration's own inter beta is not used: the rate is what was shaped. Everything but alpha
is the median over the calibrations of the layout at the smallest delay measured at that rate
(the delayer upsets the fit of o), alpha's the median at its own delay; either takes the lines
the library warned were disturbed only when there are no others. Contention is on (the default): a host's ranks
share its NIC, as they share the shaped link. Errors: per (algorithm, size), their geometric mean
(an error below 0.01 % counts as 0.01 %), and the worst point from --from (64 KiB).
"""
import argparse
import json
import math
import os
import re
import statistics
import subprocess
import sys
from collections import defaultdict

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from bench import layout_of  # noqa: E402

# TCP payload per frame over what tbf counts: 1448 bytes (1500 MTU less 20 IP and 32 TCP with
# timestamps) per 1514 (the frame with its Ethernet header).
PAYLOAD_FRACTION = 1448 / 1514
FROM_BYTES = 64 << 10
# What the emulated hosts' links carry unshaped, GB/s (docs/performance.md, "Run 7 again"): the
# bytes of a full tbf bucket pass at about that.
PEAK_GBPS = 2.0
# Calls simulated back to back (fabricoll-sim --calls): the measured loop's steady state.
CALLS = 4
# tbf's smallest bucket (scripts/netns-cluster.sh's tc_sizes): GSO packets must pass whole.
MIN_BURST = 128 << 10
# the targets the simulator is held to, from FROM_BYTES: geometric mean and worst error
TARGET_GEOMEAN, TARGET_WORST = 0.10, 0.25
FLOOR = 1e-4

LEVEL = r"alpha ([0-9.]+) us, beta ([0-9.]+) GB/s, o ([0-9.]+) us"
TWO = re.compile(r"calibration on (\d+) ranks, hosts of \[([0-9, ]+)\] ranks: intra " + LEVEL +
                 r"; inter " + LEVEL + r"; gamma ([0-9.]+) GB/s")
ONE = re.compile(r"calibration on (\d+) ranks: alpha ([0-9.]+) us, beta ([0-9.]+) GB/s, "
                 r"gamma ([0-9.]+) GB/s")


def parse_calibration(line):
    """The figures of a calibration line (coll/calibrate.rs's two formats): {"ranks", "hosts"
    (ranks per host, or None), "inter": (alpha us, beta GB/s, o us or None), "intra" (or None),
    "gamma" GB/s}. ValueError naming the line when it is neither."""
    m = TWO.search(line)
    if m:
        f = [float(x) for x in m.groups()[2:]]
        return {"ranks": int(m.group(1)),
                "hosts": [int(x) for x in m.group(2).split(",")],
                "intra": tuple(f[0:3]), "inter": tuple(f[3:6]), "gamma": f[6]}
    m = ONE.search(line)
    if m:
        return {"ranks": int(m.group(1)), "hosts": None, "intra": None,
                "inter": (float(m.group(2)), float(m.group(3)), None),
                "gamma": float(m.group(4))}
    raise ValueError(f"not a calibration line: {line!r}")


def delay_us(d):
    """'0', '500us', '1ms', '1.5ms', '1s' -> microseconds (netns-cluster.sh's syntax)."""
    m = re.fullmatch(r"([0-9.]+)(us|ms|s)?", d.strip())
    if not m:
        raise ValueError(f"delay: {d!r} is not 0, N us, N ms or N s")
    return float(m.group(1)) * {None: 1, "us": 1, "ms": 1e3, "s": 1e6}[m.group(2)]


def rate_gbit(r):
    """tc's rate syntax ('1gbit', '100mbit', '500kbit') -> Gbit/s."""
    m = re.fullmatch(r"([0-9.]+)(gbit|mbit|kbit|bit)", r.strip().lower())
    if not m or float(m.group(1)) <= 0:
        raise ValueError(f"rate: {r!r} is not a positive tc rate (1gbit, 100mbit)")
    return float(m.group(1)) * {"gbit": 1, "mbit": 1e-3, "kbit": 1e-6, "bit": 1e-9}[m.group(2)]


def rate_order(name):
    """Sort key of rate folders: by rate, unparsable names last."""
    try:
        return (rate_gbit(name), name)
    except ValueError:
        return (math.inf, name)


def layout_arg(name):
    """'2x4' -> '4,4' (fabricoll-sim's --hosts list); '3+2+1' -> '3,2,1'."""
    return ",".join(str(n) for n in layout_of(name))


def usable(records):
    """The records to take figures from: the undisturbed ones, or all when none is."""
    calm = [r for r in records if not r.get("disturbed")]
    return calm or list(records)


def tbf_burst(gbit):
    """The bucket netns-cluster.sh gives tbf at `gbit`: a millisecond of the rate, at least
    MIN_BURST bytes."""
    return max(gbit * 1e9 / 8 / 1000, MIN_BURST)


def machine(records, delay, payload=PAYLOAD_FRACTION, burst=True):
    """fabricoll-sim's parameters for one layout and delay at one rate, from the calibration
    records of that layout at that rate ({"delay", "rate", "line", "disturbed"}): see the module
    doc for which comes from where ("calibrations": how many lines gave the CPU's figures,
    "here" alpha). ValueError when a figure has no record."""
    if not records:
        raise ValueError("no calibration line for this layout")
    rate = {r["rate"] for r in records}
    if len(rate) != 1:
        raise ValueError(f"calibrations of several rates mixed: {sorted(rate)}")
    # the CPU's figures from the lines at the smallest delay measured: the delayer upsets the
    # fit of o (a burst of tiny sends), which is a cost of the sender's CPU alone
    least = min(delay_us(r["delay"]) for r in records)
    parsed = [(r, parse_calibration(r["line"]))
              for r in usable([r for r in records if delay_us(r["delay"]) == least])]
    # the latency at this delay: from this delay's lines (undisturbed ones where there are)
    here = [parse_calibration(r["line"]) for r in usable(
        [r for r in records if delay_us(r["delay"]) == delay_us(delay)])]
    if not here:
        raise ValueError(f"no calibration line at delay {delay}")
    soft = statistics.median(max(0.0, c["inter"][0] - delay_us(delay)) for c in here)

    def med(f):
        vals = [f(c) for _, c in parsed if f(c) is not None]
        return statistics.median(vals) if vals else None

    o = med(lambda c: c["inter"][2])
    gbit = rate_gbit(rate.pop())
    p = {"gbit": gbit * payload, "delay_us": delay_us(delay),
         "burst": tbf_burst(gbit) * payload if burst else None,
         "soft_us": soft, "alpha_us": delay_us(delay) + soft,
         "o_us": o if o is not None else (delay_us(delay) + soft) / 2,
         "gamma_gbps": med(lambda c: c["gamma"]), "calibrations": len(parsed), "here": len(here),
         "disturbed": sum(1 for r, _ in parsed if r.get("disturbed"))}
    if any(c["intra"] for _, c in parsed):
        p["intra"] = tuple(med(lambda c, i=i: c["intra"][i] if c["intra"] else None)
                           for i in range(3))
    return p


def sim_argv(sim, p, layout, coll, algos, sizes, calls=CALLS):
    """fabricoll-sim's command line for machine `p` (machine()) and the measured `sizes`: one
    geometric run when they are, else None (then one run per size: sim_argv_one)."""
    # --no-bound: every forced algorithm is compared with its measurement, so none may be
    # left out for being slower than another.
    argv = [sim, "--hosts", layout_arg(layout), "--coll", coll, "--algos", ",".join(algos),
            "--no-bound", "--gbit", f"{p['gbit']:.6g}", "--alpha-us", f"{p['alpha_us']:.6g}",
            "--o-us", f"{p['o_us']:.6g}", "--gamma-gbps", f"{p['gamma_gbps']:.6g}"]
    if calls > 1:
        argv += ["--calls", str(calls)]
    if p.get("burst"):
        argv += ["--burst", str(int(p["burst"])), "--burst-gbps", f"{PEAK_GBPS:.6g}"]
    if p.get("intra"):
        a, b, o = p["intra"]
        argv += ["--intra-alpha-us", f"{a:.6g}", "--intra-gbps", f"{b:.6g}",
                 "--intra-o-us", f"{o:.6g}"]
    sizes = sorted(sizes)
    factors = {b // a for a, b in zip(sizes, sizes[1:]) if b % a == 0 and b > a}
    geometric = len(sizes) == 1 or (len(factors) == 1 and min(factors) >= 2 and all(
        b == a * min(factors) for a, b in zip(sizes, sizes[1:])))
    if geometric:
        f = min(factors) if factors else 2
        return [argv + ["-b", str(sizes[0]), "-e", str(sizes[-1]), "-f", str(f)]]
    return [argv + ["-b", str(s), "-e", str(s)] for s in sizes]


def parse_sim(text):
    """{(size, algorithm): (time us, the name with its levels)} of fabricoll-sim's rows; the
    first row of an algorithm at a size wins (a row fabricoll-sim adds for auto's pick comes
    after the asked ones)."""
    out = {}
    for line in text.splitlines():
        w = line.split()
        if len(w) < 4 or not w[0].isdigit() or w[2] == "skipped":
            continue
        try:
            key = (int(w[0]), w[2].split("(")[0])
            out.setdefault(key, (float(w[3]), w[2]))
        except ValueError:
            continue
    return out


def load_jsonl(path):
    with open(path, encoding="utf-8") as f:
        return [json.loads(ln) for ln in f if ln.strip()]


def measured(samples):
    """{(layout, delay, coll): {(size, algorithm): median time us}} of the forced runs."""
    got = defaultdict(lambda: defaultdict(list))
    for s in samples:
        if s["tool"].startswith("algo:"):
            got[(s["layout"], s["delay"], s["coll"])][(s["size"], s["tool"][5:])].append(
                s["time_us"])
    return {k: {p: statistics.median(v) for p, v in pts.items()} for k, pts in got.items()}


def error(sim_us, meas_us):
    return abs(sim_us - meas_us) / meas_us


def geomean(errs):
    errs = list(errs)
    if not errs:
        return None
    return math.exp(sum(math.log(max(e, FLOOR)) for e in errs) / len(errs))


def summarise(points, from_bytes=FROM_BYTES):
    """points: [(algorithm, size, measured us, simulated us)] -> {"n", "geo", "n_from",
    "geo_from", "worst" (the point from `from_bytes` with the largest error, its error last)}."""
    errs = [error(s, m) for _, _, m, s in points]
    big = [(a, z, m, s, error(s, m)) for a, z, m, s in points if z >= from_bytes]
    return {"n": len(points), "geo": geomean(errs), "n_from": len(big),
            "geo_from": geomean(e[4] for e in big),
            "worst": max(big, key=lambda e: e[4]) if big else None}


def compare(meas, sim):
    """[(algorithm, size, measured, simulated)] where both have the point, and the measured
    points the simulation lacks."""
    pts, missing = [], []
    for (size, algo), m in sorted(meas.items(), key=lambda kv: (kv[0][1], kv[0][0])):
        if (size, algo) in sim and m > 0:
            pts.append((algo, size, m, sim[(size, algo)][0]))
        else:
            missing.append((algo, size))
    return pts, missing


def run_sim(argvs, timeout=600):
    """fabricoll-sim's rows over every command line; RuntimeError with its message on failure."""
    out = {}
    for argv in argvs:
        try:
            r = subprocess.run(argv, capture_output=True, text=True, timeout=timeout, check=False)
        except subprocess.TimeoutExpired as e:
            raise RuntimeError(f"{' '.join(argv)}: no answer in {timeout}s") from e
        if r.returncode != 0:
            raise RuntimeError(f"{' '.join(argv)}: {r.stderr.strip() or r.stdout.strip()}")
        for k, v in parse_sim(r.stdout).items():
            out.setdefault(k, v)
    return out


def validate(rate_dir, sim, payload=PAYLOAD_FRACTION, burst=True, calls=CALLS):
    """Every (layout, delay, coll) of one rate's bench directory: [{"rate", "layout", "delay",
    "coll", "machine", "points", "names", "missing", "argv"}] (or "error" instead of points)."""
    samples = load_jsonl(os.path.join(rate_dir, "samples.jsonl"))
    cal_path = os.path.join(rate_dir, "calibrations.jsonl")
    cals = load_jsonl(cal_path) if os.path.exists(cal_path) else []
    groups = []
    for (layout, delay, coll), meas in sorted(measured(samples).items()):
        g = {"layout": layout, "delay": delay, "coll": coll, "rate": os.path.basename(rate_dir)}
        try:
            recs = [r for r in cals if r["layout"] == layout]
            p = machine(recs, delay, payload, burst)
            g["rate"] = recs[0]["rate"]
            g["machine"] = p
            algos = sorted({a for _, a in meas})
            g["argv"] = sim_argv(sim, p, layout, coll, algos, {z for z, _ in meas}, calls)
            got = run_sim(g["argv"])
            g["points"], g["missing"] = compare(meas, got)
            g["names"] = {a: got[(z, a)][1] for a, z, _, _ in g["points"]}
        except (ValueError, RuntimeError, OSError) as e:
            g["error"] = str(e)
        groups.append(g)
    return groups


def size_name(b):
    for unit, shift in (("MiB", 20), ("KiB", 10)):
        if b >= 1 << shift and b % (1 << shift) == 0:
            return f"{b >> shift} {unit}"
    return f"{b} B"


def pct(e):
    return "-" if e is None else f"{100 * e:.1f} %"


def worst_text(w):
    if not w:
        return "-"
    a, z, m, s, e = w
    return f"{pct(e)} ({a}, {size_name(z)}: {s:.0f} vs {m:.0f} us)"


def verdict(s):
    if s["geo_from"] is None:
        return "-"
    ok = s["geo_from"] <= TARGET_GEOMEAN and s["worst"][4] <= TARGET_WORST
    return "meets" if ok else "misses"


def markdown(groups, from_bytes=FROM_BYTES):
    """The report: the parameters, a summary per layout, per (rate, layout, delay, collective),
    and per group the measured and simulated time of each algorithm and size."""
    out = []
    ok = [g for g in groups if "points" in g]
    out.append("**Parameters given to fabricoll-sim** (simval.py's docstring says where each "
               "comes from; us, GB/s for intra and gamma):\n")
    out.append("| rate | layout | delay | NIC Gbit/s | bucket B | alpha = delay + rest | inter o | "
               "intra alpha / GB/s / o | gamma | lines: this delay, all |")
    out.append("|---|---|---|---|---|---|---|---|---|---|")
    seen = set()
    for g in ok:
        key = (g["rate"], g["layout"], g["delay"])
        if key in seen:
            continue
        seen.add(key)
        p = g["machine"]
        intra = "/".join(f"{x:.2f}" for x in p["intra"]) if p.get("intra") else "-"
        cal = f"{p['here']}, {p['calibrations']}" + (
            f" ({p['disturbed']} disturbed)" if p["disturbed"] else "")
        bucket = f"{p['burst']:.0f}" if p.get("burst") else "-"
        out.append(f"| {g['rate']} | {g['layout']} | {g['delay']} | {p['gbit']:.3f} | {bucket} | "
                   f"{p['alpha_us']:.1f} = {p['delay_us']:.0f} + {p['soft_us']:.1f} | "
                   f"{p['o_us']:.2f} | {intra} | {p['gamma_gbps']:.2f} | {cal} |")
    fb = size_name(from_bytes)
    out.append(f"\n**Per layout** (every rate, delay and collective; targets from {fb}: "
               f"geometric mean <= {TARGET_GEOMEAN:.0%}, worst <= {TARGET_WORST:.0%}):\n")
    out.append(f"| layout | points | geomean error | from {fb}: points | geomean error | "
               f"worst | targets |")
    out.append("|---|---|---|---|---|---|---|")
    by_layout = defaultdict(list)
    for g in ok:
        by_layout[g["layout"]] += g["points"]
    for layout, pts in by_layout.items():
        s = summarise(pts, from_bytes)
        out.append(f"| {layout} | {s['n']} | {pct(s['geo'])} | {s['n_from']} | "
                   f"{pct(s['geo_from'])} | {worst_text(s['worst'])} | {verdict(s)} |")
    out.append("\n**Per rate, layout, delay and collective**:\n")
    out.append(f"| rate | layout | delay | collective | points | geomean error | "
               f"from {fb} | worst from {fb} |")
    out.append("|---|---|---|---|---|---|---|---|")
    for g in groups:
        if "error" in g:
            out.append(f"| {g['rate']} | {g['layout']} | {g['delay']} | {g['coll']} | "
                       f"not simulated: {g['error']} | | | |")
            continue
        s = summarise(g["points"], from_bytes)
        out.append(f"| {g['rate']} | {g['layout']} | {g['delay']} | {g['coll']} | {s['n']} | "
                   f"{pct(s['geo'])} | {pct(s['geo_from'])} | {worst_text(s['worst'])} |")
    for g in ok:
        algos = sorted({a for a, _, _, _ in g["points"]})
        sizes = sorted({z for _, z, _, _ in g["points"]})
        cell = {(a, z): (m, s) for a, z, m, s in g["points"]}
        out.append(f"\n{g['rate']}, {g['layout']}, delay {g['delay']}, {g['coll']}: measured / "
                   f"simulated us (simulated over measured, minus 1)\n")
        out.append("| size | " + " | ".join(g["names"].get(a, a) for a in algos) + " |")
        out.append("|---|" + "---|" * len(algos))
        for z in sizes:
            row = []
            for a in algos:
                if (a, z) in cell:
                    m, s = cell[(a, z)]
                    row.append(f"{m:.0f} / {s:.0f} ({100 * (s / m - 1):+.0f} %)")
                else:
                    row.append("-")
            out.append(f"| {size_name(z)} | " + " | ".join(row) + " |")
        if g["missing"]:
            out.append("\nnot simulated: " + ", ".join(f"{a} {size_name(z)}"
                                                        for a, z in g["missing"]))
    return "\n".join(out) + "\n"


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n", maxsplit=1)[0])
    p.add_argument("--dir", required=True, help="scripts/sim-validate.sh's directory")
    p.add_argument("--sim", default=os.path.join(
        os.environ.get("CARGO_TARGET_DIR", "target"), "release", "fabricoll-sim"))
    p.add_argument("--out", help="also write the Markdown report here")
    p.add_argument("--payload-fraction", type=float, default=PAYLOAD_FRACTION)
    p.add_argument("--from", dest="from_bytes", type=int, default=FROM_BYTES)
    p.add_argument("--no-burst", action="store_true",
                   help="simulate links without tbf's bucket (a NIC's wire)")
    p.add_argument("--calls", type=int, default=CALLS,
                   help="calls simulated back to back (1: one call alone)")
    a = p.parse_args(argv)
    if not 1 <= a.calls <= 64:
        p.error(f"--calls: {a.calls} is not in 1..64")
    if not 0 < a.payload_fraction <= 1:
        p.error(f"--payload-fraction: {a.payload_fraction} is not in (0, 1]")
    if not os.access(a.sim, os.X_OK):
        p.error(f"--sim: {a.sim} is not an executable (cargo build --release --bin fabricoll-sim)")
    rates = sorted((d for d in os.listdir(a.dir)
                    if os.path.exists(os.path.join(a.dir, d, "samples.jsonl"))),
                   key=rate_order)
    if not rates:
        p.error(f"--dir: no {a.dir}/<rate>/samples.jsonl")
    groups = []
    for r in rates:
        groups += validate(os.path.join(a.dir, r), a.sim, a.payload_fraction, not a.no_burst,
                           a.calls)
    text = markdown(groups, a.from_bytes)
    print(text, end="")
    if a.out:
        with open(a.out, "w", encoding="utf-8") as f:
            f.write(text)
    return 1 if any("error" in g for g in groups) else 0


if __name__ == "__main__":
    sys.exit(main())
