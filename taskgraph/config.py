"""Old path of :mod:`taskgraph.core.config`, kept for notebooks and the scripts
converted from them before the layers (``from taskgraph.config import quick``)."""

import sys

from .core import config

sys.modules[__name__] = config
