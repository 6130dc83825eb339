"""`python3 -m bench`: the same as bench/run.py."""

import sys

from .cli import main

sys.exit(main())
