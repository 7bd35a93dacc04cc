"""The training benchmark's table (scripts/torch/train_compress.py `summary`): step-time
medians, the anchor's ratio, the loss against the uncompressed run, the targets' verdicts."""
import argparse
import os
import sys
import unittest

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "torch"))
import train_compress  # noqa: E402  pylint: disable=wrong-import-position


def run(mode, steps, loss, same=True):
    return {"mode": mode, "ranks": 4, "params": 1000, "step_s": steps, "eval_loss": loss,
            "losses": [2.3, loss], "same_params": same}


class Summary(unittest.TestCase):
    def setUp(self):
        self.a = argparse.Namespace(modes=["gloo-bf16", "fp8e4m3", "off"], layout="4x1",
                                    rate="100mbit", delay="1ms", inputs=8, width=16, depth=2,
                                    batch=4, steps=10, warmup=1, reps=2)

    def test_ratios_losses_and_targets(self):
        runs = {"gloo-bf16": [run("gloo-bf16", [0.2, 0.2, 0.9], 1.0),
                              run("gloo-bf16", [0.2, 0.2, 0.2], 1.0)],
                "fp8e4m3": [run("fp8e4m3", [0.1, 0.1, 0.5], 1.005),
                            run("fp8e4m3", [0.1, 0.1, 0.1], 1.005)],
                "off": [run("off", [0.4, 0.4, 0.4], 1.0), run("off", [0.4, 0.4, 0.4], 1.0)]}
        text = train_compress.summary(self.a, runs)
        fp8 = next(l for l in text.splitlines() if l.split()[:1] == ["fp8e4m3"])
        self.assertEqual(fp8.split()[1:5], ["100.00", "2.00", "1.00500", "+0.50%"])
        self.assertIn("fp8e4m3 step >= 2x faster than gloo-bf16: 2.00 (met)", text)
        self.assertIn("fp8e4m3 final loss within 1 % of off: 0.50 % (met)", text)

    def test_misses_and_a_failed_mode(self):
        runs = {"gloo-bf16": [run("gloo-bf16", [0.2], 1.0)],
                "fp8e4m3": [run("fp8e4m3", [0.15], 1.02, same=False)], "off": []}
        text = train_compress.summary(self.a, runs)
        self.assertIn("fp8e4m3 step >= 2x faster than gloo-bf16: 1.33 (missed)", text)
        self.assertIn("       off failed", text)
        self.assertNotIn("final loss within", text)  # no uncompressed run to compare with
        fp8 = next(l for l in text.splitlines() if l.split()[:1] == ["fp8e4m3"])
        self.assertEqual(fp8.split()[-1], "False")


if __name__ == "__main__":
    unittest.main()
