"""Error paths of the backend under test: mismatched shapes between ranks, a refused operation
(a clear error naming it, the group still usable after), a killed rank (the survivors raise
within the configured timeout, never hang). tests.ranks.errors holds the rank side."""
import unittest

from tests import harness, launcher
from tests.checks import run_job

TIMEOUT_S = 5
SLACK_S = 30  # start-up of the failing call, a loaded 2-core machine


class Errors(unittest.TestCase):
    def _mismatch(self, case, provider):
        res = run_job(self, "errors", 2, provider, {"case": case, "timeout_s": TIMEOUT_S},
                      timeout=90)
        for r in res.results:
            for name, (err, secs) in r["results"].items():
                print(f"\n  rank {r['rank']} {name}: {secs:.2f}s: {err}")
                self.assertIsNotNone(err, f"rank {r['rank']}: {name} with mismatched sizes "
                                          "did not raise")
                self.assertLess(secs, TIMEOUT_S + SLACK_S, f"rank {r['rank']}: {name}: too slow")

    def test_shapes_shm(self):
        self._mismatch("shapes", "shm")

    def test_shapes_net(self):
        self._mismatch("shapes", "net")

    def test_shapes_all_gather_shm(self):
        self._mismatch("shapes_gather", "shm")

    def test_unsupported(self):
        res = run_job(self, "errors", 2, "shm", {"case": "unsupported", "timeout_s": TIMEOUT_S},
                      timeout=90)
        for r in res.results:
            out = r["results"]
            for name, words in (("BAND float32", ("band", "bitwise")),
                                ("BXOR bfloat16", ("bxor", "bitwise"))):
                err = out[name][0]
                print(f"\n  rank {r['rank']} {name}: {err}")
                self.assertIsNotNone(err, f"{name} was accepted")
                self.assertTrue(any(w in err.lower() for w in words),
                                f"{name}: the error does not name it: {err}")
            self.assertIsNone(out["after"][0], "the group failed after a refused call")
            self.assertEqual(out["after_value"], 2.0)

    def _killed(self, provider, finish):
        harness.require(self.id(), provider)
        ws = 3
        res = launcher.launch("errors", ws, f"errors-killed-{harness.BACKEND}-{provider}",
                              env=harness.provider_env(provider),
                              args={"case": "killed", "timeout_s": TIMEOUT_S, "finish": finish},
                              timeout=120)
        if res.timed_out:
            self.fail("a survivor hung: " + res.describe())
        self.assertNotEqual(res.rcs[ws - 1], 0, "the victim was not killed")
        for r in range(ws - 1):
            if res.rcs[r] != 0 or res.results[r] is None:
                self.fail(res.describe())
            out = res.results[r]["results"]
            for name in ("sync", "async", "future", "finish"):
                err, secs = out[name]
                label = finish if name == "finish" else name
                print(f"\n  survivor {r} {label}: {secs:.2f}s: {err}")
                self.assertLess(secs, TIMEOUT_S + SLACK_S, f"survivor {r}: {name} took too long")
            for name in ("sync", "async", "future"):
                self.assertIsNotNone(out[name][0], f"survivor {r}: {name} did not raise")

    def test_killed_rank_shm_abort(self):
        self._killed("shm", "abort")

    def test_killed_rank_net_destroy(self):
        self._killed("net", "destroy")


if __name__ == "__main__":
    unittest.main()
