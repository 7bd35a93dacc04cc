"""Compressed groups (``fabricoll.torch.Options(compress=...)``): float32 all_reduce with bf16
and int8 codes, identical on every rank and within the documented bound of the uncompressed
result (tests.ranks.compress holds the rank side); DDP training through a compressed group
ends where the uncompressed run ends (tests.ranks.train_compress); a name the library does not
know fails where it is written, naming the option and the accepted names."""
import unittest

from fabricoll import _bootstrap, _capi as c
from tests.checks import assert_checks, run_job


class Compress(unittest.TestCase):
    def test_bf16_and_int8_shm_2(self):
        assert_checks(self, run_job(self, "compress", 2, "shm", {"formats": ["bf16", "int8"]}))

    def test_bf16_and_int8_net_3(self):
        assert_checks(self, run_job(self, "compress", 3, "net", {"formats": ["bf16", "int8"]}))

    def test_ddp_training_with_fp8_gradients_ends_as_uncompressed_shm_2(self):
        """The same model, data and steps with fp8 codes and uncompressed: the training loss
        falls, the ranks end with identical parameters, and the final held-out loss is within
        1 % of the uncompressed run's, yet not equal to it (the codes were really used)."""
        args = {"inputs": 64, "width": 256, "depth": 3, "batch": 32, "steps": 150,
                "log_every": 10}
        got = {}
        for mode in ("off", "fp8e4m3"):
            res = run_job(self, "train_compress", 2, "shm", dict(args, mode=mode))
            got[mode] = res.results[0]
        for mode, r in got.items():
            self.assertTrue(r["same_params"], f"{mode}: the ranks' parameters differ")
            self.assertLess(r["losses"][-1], 0.7 * r["losses"][0], f"{mode}: {r['losses']}")
        off, fp8 = got["off"]["eval_loss"], got["fp8e4m3"]["eval_loss"]
        self.assertLessEqual(abs(fp8 / off - 1), 0.01, f"fp8e4m3 {fp8} against off {off}")
        self.assertNotEqual(fp8, off, "the compressed run gave the uncompressed run's loss")

    def test_invalid_names_fail_naming_the_option(self):
        for bad in ("fp4", "", 6, "int 8"):
            with self.assertRaises(ValueError) as e:
                _bootstrap.Options(compress=bad)
            self.assertIn("Options.compress", str(e.exception))
            self.assertIn("int8", str(e.exception))
        for bad in (0, -1, 1 << 21, "64", True):
            with self.assertRaises(ValueError) as e:
                _bootstrap.Options(compress_block=bad)
            self.assertIn("Options.compress_block", str(e.exception))
        # Set after construction: the group's creation refuses it.
        o = _bootstrap.Options()
        o.compress = "fp4"
        with self.assertRaises(ValueError):
            _bootstrap._config(o, None, None)  # pylint: disable=protected-access

    def test_names_reach_the_config(self):
        for name, value in c.COMPRESS.items():
            cfg, _keep = _bootstrap._config(  # pylint: disable=protected-access
                _bootstrap.Options(compress=name.upper(), compress_block=64), None, None)
            self.assertEqual((cfg.compress, cfg.compress_block), (value, 64))
        cfg, _keep = _bootstrap._config(_bootstrap.Options(), None, None)  # pylint: disable=protected-access
        self.assertEqual((cfg.compress, cfg.compress_block), (c.COMPRESS_DEFAULT, 0))
        self.assertIn("compress='int8'", repr(_bootstrap.Options(compress="int8")))


if __name__ == "__main__":
    unittest.main()
