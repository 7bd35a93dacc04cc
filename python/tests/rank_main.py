"""Entry point of one rank: `python -m tests.rank_main MODULE OUTDIR ARGS_JSON` (tests.launcher).

Runs MODULE.run(args) and writes its returned dict to OUTDIR/rank<RANK>.json, with
"error" holding the traceback when it raised (the exit status is then 1).
"""
import importlib
import json
import os
import sys
import traceback


def main():
    module, outdir, args = sys.argv[1], sys.argv[2], json.loads(sys.argv[3])
    rank = int(os.environ["RANK"])
    out = {"rank": rank}
    rc = 0
    try:
        mod = importlib.import_module(module)
        out.update(mod.run(args) or {})
    except BaseException:  # pylint: disable=broad-except  # reported to the test, then exit 1
        out["error"] = traceback.format_exc()
        print(out["error"], file=sys.stderr, flush=True)
        rc = 1
    tmp = os.path.join(outdir, f"rank{rank}.json.tmp")
    with open(tmp, "w", encoding="utf-8") as f:
        json.dump(out, f)
    os.replace(tmp, os.path.join(outdir, f"rank{rank}.json"))
    sys.stdout.flush()
    sys.stderr.flush()
    # skip interpreter teardown: a backend's threads must not turn a finished rank into a hang
    os._exit(rc)


if __name__ == "__main__":
    main()
