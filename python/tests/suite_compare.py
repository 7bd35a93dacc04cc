"""Compare two runs of PyTorch's distributed tests (tests.torch_suite --json): counts of each,
and every test that passed with the second backend (gloo) but not with the first (fabricoll),
grouped by the reason it gave (a skip's reason, or the last line of the failure).

    python -m tests.suite_compare suite-fabricoll-all.json suite-gloo-all.json
"""
import collections
import json
import re
import sys


def load(path):
    with open(path, encoding="utf-8") as f:
        return json.load(f)


EXC = re.compile(r"^(\w+\.)*[A-Z]\w*: \S")  # "AssertionError: ...", "pkg.mod.Unsupported: ..."


def reason(why):
    """The line that says why: the last exception line of a failure, else the last line."""
    lines = [ln.strip() for ln in why.strip().splitlines() if ln.strip()]
    # a spawned rank's failure ends with the parent's advice; the cause is the last exception
    for ln in reversed(lines):
        if EXC.match(ln):
            return ln[:240]
    return (lines[-1] if lines else "")[:240]


def main(ours_path, theirs_path):
    ours, theirs = load(ours_path), load(theirs_path)
    for run in (ours, theirs):
        c = collections.Counter(v[0] for v in run["tests"].values())
        print(f"{run['backend']:>10}: {c['passed']} passed, {c['failed']} failed, "
              f"{c['skipped']} skipped of {len(run['tests'])} (world size {run['world_size']}, "
              f"{run.get('seconds', '?')}s)")
    lost = collections.defaultdict(list)
    for name, (status, why) in sorted(theirs["tests"].items()):
        mine = ours["tests"].get(name, ["not run", ""])
        if status == "passed" and mine[0] != "passed":
            lost[(mine[0], reason(mine[1]))].append(name)
    gained = [n for n, (s, _) in sorted(ours["tests"].items())
              if s == "passed" and theirs["tests"].get(n, ["", ""])[0] != "passed"]
    print(f"\npassed with {theirs['backend']}, not with {ours['backend']}: "
          f"{sum(len(v) for v in lost.values())}")
    for (status, why), names in sorted(lost.items(), key=lambda kv: -len(kv[1])):
        print(f"  [{status}] {len(names)}: {why}")
        for n in names:
            print(f"      {n}")
    print(f"\npassed with {ours['backend']}, not with {theirs['backend']}: {len(gained)}")
    for n in gained:
        print(f"      {n}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1], sys.argv[2]))
