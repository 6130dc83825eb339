"""Unit tests of the `floor` section's arithmetic: the goal's ratio is of the threads'
run time (schedstat), not of utime+stime, whose 10 ms ticks the table shows beside it.
Run from the repository root (scripts/test does):

    python3 -m unittest discover -s bench -t .
"""

import unittest

from bench.sections import floor


def side(cpu, threads, window=60.0, cs=9000, cycles=7680):
    return {"window": window, "cpu": cpu, "cs": cs, "threads": threads, "cycles": cycles}


def data(rounds):
    return {"targets": 64, "lanes": 128, "rounds": rounds, "before": None}


class FloorRatio(unittest.TestCase):
    def test_the_goal_is_the_run_time_ratio_not_the_ticks(self):
        # Run time 0.290 s against 0.250 s (1.16); in ticks 0.30 against 0.24 (1.25):
        # the agent's figure rounded up a tick, the floor's down.
        r = {"agent": side(0.30, {"lanes-create": 0.150, "lanes-overwrite": 0.120,
                                  "vm-sampler": 0.012, "stallwatch": 0.008}),
             "floor": side(0.24, {"lanes-create": 0.130, "lanes-overwrite": 0.120}),
             "order": ["agent", "floor"], "load": [0.1, 0.1, 0.1]}
        d = data([r, r, r])
        self.assertAlmostEqual(floor.cpu_ratios(d)[0], 0.290 / 0.250)
        self.assertAlmostEqual(floor.cpu_ratios(d, floor.pct_core)[0], 1.25)
        (goal,) = floor.goals(d)
        self.assertTrue(goal.ok, goal)
        self.assertIn("1.16", goal.measured)

    def test_a_floor_without_run_time_is_left_out(self):
        r = {"agent": side(0.3, {"lanes-create": 0.3}), "floor": side(0.0, {}),
             "order": ["agent", "floor"], "load": [0.1, 0.1, 0.1]}
        self.assertEqual(floor.cpu_ratios(data([r])), [])


if __name__ == "__main__":
    unittest.main()
