"""Old path of :mod:`taskgraph.batch.cli`: job scripts rendered before the layers run
``python -m taskgraph.cli mpi-env``."""

import sys

from .batch import cli

if __name__ == "__main__":
    sys.exit(cli.main())
sys.modules[__name__] = cli
