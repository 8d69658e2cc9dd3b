"""The handler context's public path (``from tombstones.context import HandlerContext``).

It lives in :mod:`tombstones.jobs.context`; this module only hands it on.
"""

from .jobs.context import HandlerContext

__all__ = ["HandlerContext"]
