"""The three columns every fenced write reads and moves: generation, version, deleted_at.

An abstract model of its own, below the write paths (:mod:`.writes`, :mod:`.fencing`) and the
querysets, so that they can name it without importing the mixin that is built on them.
"""

from __future__ import annotations

from django.db import models


class FencedFields(models.Model):
    generation = models.PositiveIntegerField(
        default=1, editable=False, help_text="Incarnation of the business key; +1 per recreate."
    )
    version = models.PositiveIntegerField(
        default=1, editable=False, help_text="Bumped by every write; fences jobs and forms."
    )
    deleted_at = models.DateTimeField(
        null=True, blank=True, editable=False, db_index=True, help_text="Set when tombstoned."
    )

    class Meta:
        abstract = True
