#!/usr/bin/env python3
"""stallwatch benchmark: `bench/run.py --help`. A thin wrapper around the `bench`
package beside it (bench/cli.py), so that the script runs from anywhere."""

import sys
from pathlib import Path

# The repository root, not bench/, on the path: the package is imported as `bench`.
sys.path[0] = str(Path(__file__).resolve().parent.parent)

from bench.cli import main  # noqa: E402

if __name__ == "__main__":
    sys.exit(main())
