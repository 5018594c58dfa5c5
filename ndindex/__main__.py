"""Run the ndindex command line: python -m ndindex."""

import sys

from ndindex.console import run

sys.exit(run())
