"""Unit tests of the `matrix` section's reading of matrix::full's rows: the goals (all
named, >= 95 % agreeing) and the table with its exceptions. Run from the repository root
(scripts/test does):

    python3 -m unittest discover -s bench -t .
"""

import tempfile
import unittest
from pathlib import Path
from unittest import mock

from bench.results import through_json
from bench.sections import matrix


def row(scenario, fs, cause, kernel, agrees, mixed=False, named=True):
    return {"scenario": scenario, "fs": fs, "mode": "overwrite", "op": "fsync", "seconds": 3.9,
            "cause": cause, "symbol": "submit_bio_wait", "verdict": "v", "named": named,
            "agrees": agrees, "mixed": mixed,
            "kernel": {"class": kernel, "frame": "folio_wait_writeback", "seconds": 3.8,
                       "shares": {kernel: 2.1, cause: 1.7}, "stack": ["a", "b"]}}


def data(rows, cells):
    return {"rows": rows, "cells": [{"scenario": s, "fs": f} for s, f in cells],
            "seconds": 290.0, "exit": 0}


class Goals(unittest.TestCase):
    def test_all_agreeing_meets_both(self):
        d = data([row("freeze", "ext4", "frozen", "frozen", True)] * 20, [("freeze", "ext4")])
        g = matrix.goals(d)
        self.assertTrue(all(x.ok for x in g), g)
        self.assertEqual(g[1].measured, "20 of 20 (100%)")

    def test_one_in_twenty_disagreeing_is_the_line(self):
        rows = [row("storm", "xfs", "writeback_wait", "writeback_wait", True)] * 19
        rows.append(row("storm", "xfs", "device_queue", "writeback_wait", False, mixed=True))
        self.assertTrue(matrix.goals(data(rows, [("storm", "xfs")]))[1].ok)
        rows.append(row("storm", "xfs", "device_queue", "writeback_wait", False, mixed=True))
        self.assertFalse(matrix.goals(data(rows, [("storm", "xfs")]))[1].ok)

    def test_an_other_cause_misses_the_first(self):
        rows = [row("drop", "ext4", "other", "metadata_buffer", False, named=False)]
        self.assertFalse(matrix.goals(data(rows, [("drop", "ext4")]))[0].ok)

    def test_no_stall_at_all_is_not_a_pass(self):
        self.assertFalse(any(g.ok for g in matrix.goals(data([], [("cold", "ext4")]))))


class Tables(unittest.TestCase):
    def test_cells_and_exceptions(self):
        rows = [row("storm", "xfs", "writeback_wait", "writeback_wait", True),
                row("storm", "xfs", "device_queue", "writeback_wait", False, mixed=True),
                row("storm", "ext4", "writeback_wait", "writeback_wait", True)]
        d = through_json(data(rows, [("storm", "ext4"), ("storm", "xfs"), ("cold", "ext4"),
                                     ("cold", "xfs"), ("FUSE", "fuse")]))
        [t] = matrix.tables(d, {"matrix_only": None})
        self.assertEqual(t.head, ("scenario", "ext4", "xfs", "fuse"))
        self.assertEqual(t.rows[0], ("storm", "1: writeback_wait; agree 1/1",
                                     "2: device_queue, writeback_wait; agree 1/2 (1 mixed)", "-"))
        self.assertEqual(t.rows[1], ("cold", "no stall >= 2 s", "no stall >= 2 s", "-"))
        self.assertIn("3 stalls >= 2 s, 3 with a named cause, 2 agree", t.notes[0])
        self.assertEqual(len(t.notes), 2)
        self.assertIn("agent device_queue at submit_bio_wait, kernel writeback_wait", t.notes[1])


def sysctl_files(d, values):
    """Four files standing for vm.dirty_{ratio,bytes,background_ratio,background_bytes},
    holding `values` as procfs writes them (a newline after each)."""
    files = [Path(d) / n for n in ("ratio", "bytes", "bg_ratio", "bg_bytes")]
    for f, v in zip(files, values):
        f.write_text(v + "\n")
    return files


class RestoreDirty(unittest.TestCase):
    def test_the_nonzero_one_of_each_pair_is_written_back(self):
        with tempfile.TemporaryDirectory() as d:
            files = sysctl_files(d, ("0", "16777216", "0", "8388608"))
            with mock.patch.object(matrix, "DIRTY", files):
                matrix.restore_dirty(["20", "0", "0", "4194304"])
            self.assertEqual(files[0].read_text(), "20")
            self.assertEqual(files[1].read_text().strip(), "16777216", "the ratio's pair is left")
            self.assertEqual(files[3].read_text(), "4194304")

    def test_nothing_is_written_when_nothing_changed(self):
        with tempfile.TemporaryDirectory() as d:
            files = sysctl_files(d, ("20", "0", "10", "0"))
            with mock.patch.object(matrix, "DIRTY", files):
                matrix.restore_dirty(["20", "0", "10", "0"])
            self.assertEqual(files[0].read_text(), "20\n")


if __name__ == "__main__":
    unittest.main()
