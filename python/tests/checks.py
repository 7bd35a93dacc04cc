"""Test-side assertions over a job's per-rank results (tests.launcher.JobResult)."""
import unittest

from tests import harness, launcher


def run_job(case, job, nranks, provider, args=None, timeout=240, env=None, variant=None):
    """Launch `job` at `nranks` over `provider` and fail `case` unless every rank ended well
    (`variant`: a word naming `env`'s choice in the job's tag and log directory)."""
    harness.require(case.id(), provider)
    e = harness.provider_env(provider)
    e.update(env or {})
    tag = f"{job}-{harness.BACKEND}-{provider}-{nranks}" + (f"-{variant}" if variant else "")
    res = launcher.launch(job, nranks, tag, env=e, args=args, timeout=timeout)
    if res.timed_out or any(rc != 0 for rc in res.rcs) or any(r is None for r in res.results):
        case.fail(res.describe())
    return res


def assert_checks(case, res):
    """Fail unless no rank's check failed; print the counts (and what was refused)."""
    failed, unsupported, ok = [], set(), 0
    for r in res.results:
        for c in r.get("checks", []):
            if c["status"] == "failed":
                failed.append(f"rank {r['rank']}: {c['name']}: {c['msg']}")
            elif c["status"] == "unsupported":
                unsupported.add(f"{c['name']}: {c['msg'].splitlines()[0][:160]}")
            else:
                ok += 1
    n = len(res.results[0].get("checks", []))
    print(f"\n  {res.tag}: {n} checks per rank, {ok} rank-checks ok, {len(unsupported)} refused"
          f" (clear error), {len(failed)} rank-checks failed, {res.elapsed:.1f}s")
    for u in sorted(unsupported):
        print(f"    refused: {u}")
    if failed:
        case.fail(f"{len(failed)} failed checks (logs in {res.outdir}):\n" + "\n".join(failed[:30]))


def matrix_case(module, name, job, doc):
    """A TestCase class `name` (of `module`) running `job` once per (provider, rank count):
    test_shm_2, test_shm_4, test_net_2, test_net_4."""

    def make(nranks, provider):
        def test(self):
            assert_checks(self, run_job(self, job, nranks, provider))
        test.__doc__ = f"{job} at {nranks} ranks over {provider}"
        return test

    attrs = {"__doc__": doc, "__module__": module}
    for provider in ("shm", "net"):
        for nranks in (2, 4):
            attrs[f"test_{provider}_{nranks}"] = make(nranks, provider)
    return type(name, (unittest.TestCase,), attrs)
