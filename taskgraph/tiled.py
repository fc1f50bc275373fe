"""Old path of :mod:`taskgraph.dsl.tiled`, kept for notebooks and the scripts
converted from them before the layers (``from taskgraph.tiled import spd_dense``)."""

import sys

from .dsl import tiled

sys.modules[__name__] = tiled
