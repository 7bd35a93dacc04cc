"""Unit tests of scripts/coll_tests.py's matrix: which pairs exist and which providers each
rank count runs them over."""
import os
import sys
import unittest

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import coll_tests  # noqa: E402

LISTING = "ring allreduce allgather\npairwise alltoall\n"


class Matrix(unittest.TestCase):
    def test_only_implemented_pairs_and_auto_for_every_collective(self):
        got = coll_tests.implemented_pairs(LISTING, ["ring", "pairwise", "auto"],
                                           ["allreduce", "alltoall"])
        self.assertEqual(got, [("ring", "allreduce"), ("pairwise", "alltoall"),
                               ("auto", "allreduce"), ("auto", "alltoall")])
        with self.assertRaises(SystemExit):
            coll_tests.implemented_pairs(LISTING, ["nope"], ["allreduce"])

    def test_every_pair_meets_every_provider_at_4_ranks_and_across_2_5_8(self):
        provs = ["tcp", "shm", "net"]
        for ai in range(12):
            for ci in range(6):
                self.assertEqual(coll_tests.providers_for(4, ai, ci, provs, False), provs)
                seen = {p for r in (2, 5, 8)
                        for p in coll_tests.providers_for(r, ai, ci, provs, False)}
                self.assertEqual(seen, set(provs), (ai, ci))
                self.assertEqual(len(coll_tests.providers_for(3, ai, ci, provs, False)), 1)
                self.assertEqual(coll_tests.providers_for(3, ai, ci, provs, True), provs)

    def test_net_left_out_is_skipped_from_1_18_and_missing_before(self):
        why, by_design = coll_tests.net_absence((2, 1))
        self.assertTrue(by_design)
        self.assertIn("2.1 has no net", why)
        why, by_design = coll_tests.net_absence((1, 18))
        self.assertTrue(by_design)
        for version in [(1, 17), None]:
            why, by_design = coll_tests.net_absence(version)
            self.assertFalse(by_design, version)
            self.assertIn("should", why)


if __name__ == "__main__":
    unittest.main()
