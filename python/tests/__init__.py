"""Tests of the torch.distributed backend `fabricoll`, run by scripts/torch-tests.sh.

Each test module launches its ranks as subprocesses (tests.launcher) running rank-side code
from tests.ranks; run one with `cd python && python -m unittest tests.test_ops -v`.
"""
