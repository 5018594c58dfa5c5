"""Run the ndindex command line: python -m ndindex."""

import sys

from ndindex.cli import main

sys.exit(main())
