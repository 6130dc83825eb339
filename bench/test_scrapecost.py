"""Unit tests of the pure parts of the scrape-cost measurement (scrapecost.py): the
Content-Type and body checks, the rotation of the blocks, the CPU less the idle
background, the 6d table. Run from the repository root (scripts/test does):

    python3 -m unittest discover -s bench -t .
"""

import os
import time
import unittest
from unittest import mock

from bench import scrapecost as sc
from bench.harness import MeasureError, task_cpu
from bench.results import through_json
from bench.tables import markdown


def varint(n):
    out = bytearray()
    while True:
        b = n & 0x7F
        n >>= 7
        out.append(b | (0x80 if n else 0))
        if not n:
            return bytes(out)


def family(name, extra=b""):
    """A MetricFamily message: field 1 (name), then `extra` (other fields' bytes)."""
    nm = name.encode()
    return b"\x0a" + varint(len(nm)) + nm + extra


def delimited(*msgs):
    return b"".join(varint(len(m)) + m for m in msgs)


class ContentType(unittest.TestCase):
    # What the agent sends (src/exposition/registry.rs, Format::content_type).
    TEXT = "text/plain; version=0.0.4; charset=utf-8"
    OM = "application/openmetrics-text; version=1.0.0; charset=utf-8"
    PB = ("application/vnd.google.protobuf; proto=io.prometheus.client.MetricFamily; "
          "encoding=delimited")

    def want(self, key):
        return {k: ct for k, _, _, ct in sc.FORMATS}[key]

    def test_each_format_matches_its_own_content_type_only(self):
        sent = {"text": self.TEXT, "om": self.OM, "pb": self.PB}
        for key in sent:
            for other, ct in sent.items():
                self.assertEqual(sc.ctype_matches(ct, self.want(key)), key == other, (key, ct))

    def test_parameters_case_quotes_and_spacing(self):
        self.assertEqual(sc.media_type('Text/Plain;Version="0.0.4" ; charset=utf-8'),
                         ("text/plain", {"version": "0.0.4", "charset": "utf-8"}))
        self.assertTrue(sc.ctype_matches("text/plain;version=0.0.4", self.want("text")))

    def test_a_missing_or_other_parameter_does_not_match(self):
        self.assertFalse(sc.ctype_matches("text/plain; charset=utf-8", self.want("text")))
        self.assertFalse(sc.ctype_matches("application/openmetrics-text; version=0.0.1",
                                          self.want("om")))
        self.assertFalse(sc.ctype_matches("application/vnd.google.protobuf; "
                                          "proto=io.prometheus.client.MetricFamily; "
                                          "encoding=text", self.want("pb")))
        self.assertFalse(sc.ctype_matches("", self.want("text")))
        self.assertFalse(sc.ctype_matches(None, self.want("text")))

    def test_check_response(self):
        pb, pb_gz = sc.format_rows()[2], sc.format_rows()[5]
        self.assertEqual((pb.key, pb_gz.key), ("pb", "pb_gzip"))
        sc.check_response(pb, "", self.PB, "u")
        sc.check_response(pb_gz, "gzip", self.PB, "u")
        with self.assertRaises(MeasureError):
            sc.check_response(pb, "", self.TEXT, "u")  # text served for protobuf
        with self.assertRaises(MeasureError):
            sc.check_response(pb_gz, "", self.PB, "u")  # not gzipped
        with self.assertRaises(MeasureError):
            sc.check_response(pb, "gzip", self.PB, "u")  # gzipped unasked
        # Rows of 3 and 6b name no Content-Type: only the encoding is checked.
        sc.check_response(sc.ROWS[0], "", "whatever", "u")


class BodyFormat(unittest.TestCase):
    TEXT = b"# HELP a_total A.\n# TYPE a_total counter\na_total 1\n"
    OM = b"# HELP a A.\n# TYPE a counter\na_total 1\n# EOF\n"

    def test_text_and_openmetrics(self):
        self.assertEqual(sc.body_format(self.TEXT), "text")
        self.assertEqual(sc.body_format(self.OM), "om")

    def test_protobuf_with_long_messages(self):
        # A message over 127 bytes: a two-byte length varint.
        big = family("stallwatch_probe_duration_seconds", b"\x10\x04" + b"\x22" + varint(300)
                     + bytes(300))
        body = delimited(family("a_total", b"\x10\x00"), big, family("ns:b_c"))
        self.assertGreater(len(big), 127)
        self.assertEqual(sc.delimited_names(body),
                         ["a_total", "stallwatch_probe_duration_seconds", "ns:b_c"])
        self.assertEqual(sc.body_format(body), "pb")

    def test_not_protobuf(self):
        good = delimited(family("a_total"), family("b"))
        for bad in (b"", good[:-1], good + b"\x00", b"\x05\x12\x03abc",  # field 2 first
                    delimited(b"\x0a\x03a b"), b"a_total 1\n", b"\xff\xff"):
            self.assertIsNone(sc.body_format(bad), bad)

    def test_check_body_reads_the_bytes_not_the_header(self):
        import gzip

        class Client:
            def __init__(self, body, enc=None):
                self.body, self.enc = body, enc

            def get(self, path, gzip=False, accept=None):
                return self.body, 0.001, self.enc

        rows = {r.key: r for r in sc.format_rows()}
        sc.check_body(Client(self.TEXT), rows["text"])
        sc.check_body(Client(gzip.compress(self.OM), "gzip"), rows["om_gzip"])
        sc.check_body(Client(delimited(family("a"))), rows["pb"])
        with self.assertRaises(MeasureError):
            sc.check_body(Client(self.TEXT), rows["pb"])
        with self.assertRaises(MeasureError):
            sc.check_body(Client(self.OM), rows["text"])
        with self.assertRaises(MeasureError):
            sc.check_body(Client(self.OM), rows["om_gzip"])  # not gzipped


class FakeClock:
    """time.sleep and time.monotonic of scrapecost, without waiting."""

    def __init__(self):
        self.now = 0.0

    def sleep(self, s):
        self.now += s

    def monotonic(self):
        return self.now


class Blocks(unittest.TestCase):
    def test_rotation_puts_each_row_after_each_other(self):
        rows = ["a", "b", "c"]
        self.assertEqual([sc.rotation(rows, i) for i in range(4)],
                         [["a", "b", "c"], ["b", "c", "a"], ["c", "a", "b"], ["a", "b", "c"]])

    def test_blocks_interleave_rows_count_cpu_and_idle(self):
        """Six format rows and the idle block: every row gets its requests in blocks of
        25 in rotation; CPU is the server's over each row's blocks; the idle block lasts
        as long as the one before it."""
        clock = FakeClock()
        cpu = {"s": 0.0}
        calls = []
        ct = {k: f"{t}; " + "; ".join(f"{a}={b}" for a, b in p.items())
              for k, _, _, (t, p) in sc.FORMATS}

        def curl_block(url, n, gzip, accept):
            key = next(k for k, _, a, _ in sc.FORMATS if a == accept)
            calls.append((key, gzip, n))
            clock.now += 0.002 * n  # 2 ms a request
            cpu["s"] += 0.001 * n  # 1 ms of server CPU a request...
            return [(0.002, 1000 if gzip else 9000, "gzip" if gzip else "", ct[key])] * n

        def task_cpu(pid):  # ...and a background of 10 ms/s of wall
            return cpu["s"] + 0.01 * clock.now

        with mock.patch.object(sc, "time", clock), \
             mock.patch.object(sc, "curl_block", curl_block), \
             mock.patch.object(sc, "task_cpu", task_cpu):
            out = sc.blocks({"sw": "u"}, 60, sc.format_rows(), cpu_of=1)
        # 3 rounds (25, 25, 10) of 6 rows; the round's first row rotates.
        self.assertEqual(len(calls), 18)
        self.assertEqual([c[2] for c in calls], [25] * 12 + [10] * 6)
        self.assertEqual(calls[0][:2], ("text", False))
        self.assertEqual(calls[6][:2], ("om", False))  # round 1 starts at the 2nd row
        for r in sc.format_rows():
            self.assertEqual(out[r.key]["n"], 60)
            self.assertAlmostEqual(out[r.key]["wall"], 0.12)
            self.assertAlmostEqual(out[r.key]["cpu"], 0.06 + 0.0012)
            gross, net = sc.cpu_per_scrape(out, r.key)
            self.assertAlmostEqual(gross, 0.001 + 0.00002)
            self.assertAlmostEqual(net, 0.001)  # the background taken off exactly
        self.assertAlmostEqual(out["idle"]["cpu"], 0.01 * out["idle"]["wall"])
        self.assertAlmostEqual(out["idle"]["wall"], 0.12)  # as long as a mean row

    def test_a_wrong_content_type_in_a_block_fails(self):
        clock = FakeClock()

        def curl_block(url, n, gzip, accept):
            return [(0.002, 9000, "gzip" if gzip else "", "text/plain; version=0.0.4")] * n

        with mock.patch.object(sc, "time", clock), \
             mock.patch.object(sc, "curl_block", curl_block), \
             mock.patch.object(sc, "task_cpu", lambda pid: 0.0):
            with self.assertRaisesRegex(MeasureError, "OpenMetrics"):
                sc.blocks({"sw": "u"}, 25, sc.format_rows(), cpu_of=1)

    def test_no_idle_tick_subtracts_nothing(self):
        out = {"pb": {"cpu": 0.5, "wall": 2.0, "n": 500}, "idle": {"cpu": 0.0, "wall": 2.0}}
        self.assertEqual(sc.cpu_per_scrape(out, "pb"), (0.001, 0.001))


class TaskCpu(unittest.TestCase):
    def test_the_threads_schedstat_against_the_process_clock(self):
        """task_cpu of this process over a busy spin of 100 ms of CPU, against
        CLOCK_PROCESS_CPUTIME_ID (time.process_time): within 25 ms. schedstat's runtime of
        the running thread (this one) is updated at the scheduler tick, so it may lag by a
        tick (10 ms at HZ=100); two and a half ticks keep the test from failing on a
        loaded machine while a wrong unit or a missing thread is still far outside."""
        pid = os.getpid()
        a, p0 = task_cpu(pid), time.process_time()
        while time.process_time() - p0 < 0.1:
            pass
        b, p1 = task_cpu(pid), time.process_time()
        self.assertAlmostEqual(b - a, p1 - p0, delta=0.025)


class FormatTable(unittest.TestCase):
    def test_renders_after_json_with_ratios_to_text(self):
        def row(p99, size, cpu):
            return {"p50": p99 / 2, "p99": p99, "max": 2 * p99, "bytes": size, "n": 100,
                    "cpu": cpu, "wall": 1.0}

        one = {"text": row(0.004, 1_000_000, 0.2), "om": row(0.005, 1_100_000, 0.3),
               "pb": row(0.002, 500_000, 0.2), "text_gzip": row(0.004, 80_000, 0.3),
               "om_gzip": row(0.006, 100_000, 0.4), "pb_gzip": row(0.004, 90_000, 0.3),
               "idle": {"cpu": 0.01, "wall": 1.0},
               "mem": {"rss_before": 16384, "rss_after": 17408, "hwm_before": 18000,
                       "hwm_after": 18432}, "cpu_check": {"stat": 2.0, "tasks": 2.01}}
        t = sc.format_table("6d", "cap", through_json({64: one}))
        self.assertEqual(len(t.rows), 6)
        pb = t.rows[2]
        # (0.2 - 0.01) / 100 s: 1.90 ms; p99 0.5 of text, CPU 1.0, bytes 0.5.
        self.assertEqual(pb, ("64", "protobuf", "1.00 ms", "2.00 ms", "4.00 ms", "500000",
                              "1.90 ms", "0.50", "1.00", "0.50"))
        self.assertEqual(t.rows[5][-3:], ("1.00", "1.00", "1.12"))  # pb gzip against text gzip
        self.assertIn("VmRSS 16.0 MiB before, 17.0 MiB after", t.notes[0])
        self.assertIn("| 64 | protobuf |", markdown([t]))


if __name__ == "__main__":
    unittest.main()
