"""The race fixture's public path (``from tombstones.testing import RaceFixture``).

It lives in :mod:`tombstones.contrib.racefixture`; this module only hands its names on.
"""

from .contrib.racefixture import *  # noqa: F403
from .contrib.racefixture import __all__  # noqa: F401
