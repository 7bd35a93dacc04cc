"""DDP and FSDP2 training steps with the backend under test against gloo in the same job, at 2
and 4 ranks over shm and net (tests.ranks.train)."""
import unittest

from tests.checks import matrix_case

Training = matrix_case(__name__, "Training", "train",
                       "DDP and FSDP2: parameters after the steps equal gloo's.")


if __name__ == "__main__":
    unittest.main()
