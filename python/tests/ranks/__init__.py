"""Rank-side code of the torch tests: each module's `run(args)` is one job's body
(tests.rank_main)."""
