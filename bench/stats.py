"""Statistics and number formatting shared by every section.

Percentiles are nearest-rank, the definition `stallwatch probe` uses. Missing values
(None, or NaN before a result went through JSON) format as "n/a".
"""

import statistics

NAN = float("nan")


def missing(x):
    """True for None and NaN."""
    return x is None or x != x


def pct(values, p):
    """Nearest-rank percentile p (0-100) of values; NaN when there are none."""
    s = sorted(values)
    if not s:
        return NAN
    k = max(1, min(len(s), -(-len(s) * p // 100)))
    return s[int(k) - 1]


def med(xs):
    """Median of the values that are not missing; NaN when none is left."""
    xs = [x for x in xs if not missing(x)]
    return statistics.median(xs) if xs else NAN


def ratio(a, b):
    """a / b, NaN when either is missing or b is 0."""
    return a / b if b and not missing(a) and not missing(b) else NAN


def us(s):
    """Seconds as µs below 1 ms, else as ms."""
    if missing(s):
        return "n/a"
    return f"{s * 1e6:.0f} µs" if s < 1e-3 else f"{s * 1e3:.2f} ms"


def ms(s):
    """Seconds as ms with two decimals."""
    return "n/a" if missing(s) else f"{s * 1e3:.2f} ms"


def fixed(x, digits=3):
    """A ratio with `digits` decimals."""
    return "n/a" if missing(x) else f"{x:.{digits}f}"


def pool(runs, key):
    """The samples of `key` of every run, in one list."""
    return [x for run_ in runs for x in run_[key]]
