"""The ``ndindex`` command's entry point.

The command's modules (numpy among them) take a few tenths of a second to
load; a Ctrl-C meanwhile printed a KeyboardInterrupt traceback from deep in
an import.  Here it ends the command as a Ctrl-C during one does: a line on
stderr and exit status 130 (cli.EXIT_INTERRUPTED), nothing done yet.
"""

import sys


def run() -> int:
    try:
        from ndindex.cli import main
    except KeyboardInterrupt:
        print("ndindex: interrupted", file=sys.stderr)
        return 130
    return main()
