"""Old path of :mod:`taskgraph.batch.demo`, for ``python -m taskgraph.demo``."""

import sys

from .batch import demo

if __name__ == "__main__":
    sys.exit(demo.main())
sys.modules[__name__] = demo
