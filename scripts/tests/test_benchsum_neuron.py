"""Unit tests of scripts/benchsum_neuron.py (bench-p2p.sh's Neuron table): medians, ratios,
which rows appear, and the target lines, from synthetic samples."""
import os
import sys
import unittest

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))

import benchsum_neuron  # noqa: E402

MIB = 1 << 20


def samples(rows):
    return [r.split() for r in rows]


def row(lines, size, op):
    for line in lines[2:]:
        f = line.split()
        if f[0] == str(size) and f[1] == op:
            return f
    return None


class NeuronTable(unittest.TestCase):
    def test_medians_ratios_and_targets(self):
        rows = [
            # 8 B: latency pairs; fi_pingpong 10 us, rma_raw write 4 us, read 8 us
            "8 fp_send_lat 10", "8 fp_send_lat 12", "8 fp_send_lat 11", "8 fp_send_pp 0.001",
            "8 nb_send_lat 11", "8 nb_send_pp 0.0008", "8 nb_send_bw 0.002",
            "8 rr_write_lat 4", "8 rr_write_bw 0.002", "8 nb_write_lat 5.2", "8 nb_write_bw 0.002",
            "8 rr_read_lat 8", "8 rr_read_bw 0.001", "8 nb_read_lat 8.8", "8 nb_read_bw 0.001",
            "8 nb_inline_lat 4.4", "8 nb_inline_bw 0.003",
            # 1 MiB: write meets 0.9, read does not; medians of three repetitions
            f"{MIB} rr_write_lat 200", f"{MIB} rr_write_bw 5", f"{MIB} rr_write_bw 7", f"{MIB} rr_write_bw 6",
            f"{MIB} nb_write_lat 210", f"{MIB} nb_write_bw 5.7", f"{MIB} nb_write_bw 1", f"{MIB} nb_write_bw 9",
            f"{MIB} rr_read_lat 300", f"{MIB} rr_read_bw 4", f"{MIB} nb_read_lat 400", f"{MIB} nb_read_bw 2",
            "garbage",
        ]
        lines, bw_hits, lat_at = benchsum_neuron.table(samples(rows))
        send = row(lines, 8, "send")
        self.assertEqual(send[2:5], ["11.00", "11.00", "1.00"])  # median 11 of 10, 12, 11
        self.assertEqual(send[-1], "3/1")
        self.assertEqual(row(lines, 8, "write")[4], "1.30")
        self.assertEqual(row(lines, 8, "inline")[4], "1.10")  # iwriteInline against fi_write
        self.assertEqual(row(lines, 8, "send_st")[4], "-")
        self.assertEqual(row(lines, 8, "send_st")[7], "2.00")  # stream 0.002 / raw pp 0.001
        self.assertEqual(row(lines, MIB, "write")[5:8], ["6.0000", "5.7000", "0.95"])
        self.assertEqual(row(lines, MIB, "read")[7], "0.50")
        self.assertIsNone(row(lines, MIB, "inline"))
        self.assertEqual(bw_hits["write"][:2], [1, 1])
        self.assertEqual(bw_hits["read"][:2], [0, 1])
        t = benchsum_neuron.targets(bw_hits, lat_at)
        # best runs: neuron write 9 GB/s against raw 7; read 2 against 4
        self.assertIn("write 1/1 (worst 0.95; best runs 1/1)", t[0])
        self.assertIn("read 0/1 (worst 0.50; best runs 0/1)", t[0])
        self.assertIn("write 1.30 OVER (best runs 1.30)", t[1])
        self.assertIn("send 1.00 (best runs 1.10),", t[1])  # best: neuron 11 against raw 10
        self.assertIn("at 8 B:", t[1])

    def test_the_latency_target_is_at_8_bytes_only(self):
        rows = [f"{MIB} fp_send_lat 100", f"{MIB} nb_send_lat 300"]
        lines, bw_hits, lat_at = benchsum_neuron.table(samples(rows))
        self.assertEqual(row(lines, MIB, "send")[4], "3.00")
        self.assertEqual(lat_at, {})
        self.assertIn("no 8 B latency pairs", benchsum_neuron.targets(bw_hits, lat_at)[1])

    def test_raw_rows_stand_alone_when_the_neuron_run_failed(self):
        lines, bw_hits, lat_at = benchsum_neuron.table(samples(["8 fp_send_lat 10", "8 rr_write_lat 4"]))
        self.assertEqual(row(lines, 8, "send")[3], "-")
        self.assertEqual(row(lines, 8, "write")[2], "4.00")
        self.assertIsNone(row(lines, 8, "inline"))
        self.assertEqual((bw_hits, lat_at), ({}, {}))

    def test_no_samples(self):
        self.assertEqual(len(benchsum_neuron.table([])[0]), 2)


if __name__ == "__main__":
    unittest.main()
