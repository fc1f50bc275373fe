"""Old path of the converted scripts' shims (:mod:`taskgraph.batch.nbshim`): scripts
converted before the layers begin with ``import taskgraph.convert as _tgnb``."""

import sys

from .batch import nbshim

sys.modules[__name__] = nbshim
