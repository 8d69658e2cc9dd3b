"""The app's exceptions: one root, data on attributes, never a record's field values.

Each class's docstring is its default message. Messages carry the model label, the pk and the
generation/version numbers only, so an exception can be logged or stored without leaking personal
data.
"""

from __future__ import annotations

from typing import Any


class TombstoneError(Exception):
    """A tombstone-guard operation could not be carried out."""

    def __init__(
        self,
        message: str | None = None,
        *,
        model: str | None = None,
        pk: Any = None,
        expected_generation: int | None = None,
        found_generation: int | None = None,
        expected_version: int | None = None,
        found_version: int | None = None,
    ) -> None:
        self.model = model
        self.pk = pk
        self.expected_generation = expected_generation
        self.found_generation = found_generation
        self.expected_version = expected_version
        self.found_version = found_version
        super().__init__(message or self._default_message())

    def _default_message(self) -> str:
        text = (self.__doc__ or "").strip().splitlines()[0]
        ident = []
        if self.model is not None:
            ident.append(f"{self.model} pk={self.pk}")
        for label, expected, found in (
            ("generation", self.expected_generation, self.found_generation),
            ("version", self.expected_version, self.found_version),
        ):
            if expected is not None or found is not None:
                ident.append(f"{label} expected={expected} found={found}")
        return f"{text} ({', '.join(ident)})" if ident else text


class RecordDeleted(TombstoneError):
    """The record is a tombstone: it was deleted and cannot be written."""


class GenerationChanged(TombstoneError):
    """The record was deleted and re-created since this instance or job was made."""


class StaleVersion(TombstoneError):
    """The record changed since it was read: reload it and decide again."""


class AlreadyLive(TombstoneError):
    """A live record already holds this business key: nothing to re-create."""


class RecordMissing(TombstoneError):
    """Neither the record nor its tombstone exists (purged, or never existed)."""


class MissingFence(TombstoneError):
    """The record has no generation or version, so a job for it cannot be fenced."""


class NotATombstoneModel(MissingFence, TypeError):
    """Jobs are fenced only on instances of a TombstoneModel subclass."""


class ProtectedField(TombstoneError):
    """generation, version and deleted_at are moved only by delete(), save() and recreate()."""


class UnknownHandler(TombstoneError):
    """No job handler is registered under this name."""

    def __init__(self, name: str) -> None:
        self.handler = name
        super().__init__(f"No job handler is registered under the name {name!r}.")


class InvalidParams(TombstoneError, TypeError):
    """Job params must be a JSON object of plain values (str, int, float, bool, None, lists)."""

    # A TypeError: Django's tasks framework refuses an argument it cannot store with one.
    def __init__(self, message: str | None = None, *, field: str | None = None, **ids: Any) -> None:
        # The personal field whose value the params held: its name, never the value.
        self.field = field
        super().__init__(message, **ids)


class InvalidOrderingKey(TombstoneError, ValueError):
    """An ordering key must be a non-empty str of at most 255 characters, no control characters."""


class InvalidPriority(TombstoneError, ValueError):
    """A priority must be an int from -100 to 100 (Django's range); 0 is the default."""


class InvalidRunAfter(TombstoneError, ValueError):
    """run_after must be None or an aware datetime no later than now + TOMBSTONES_JOB_MAX_AGE."""


class UnfencedWrite(TombstoneError):
    """This write would bypass the fence: use save() or the queryset's update() instead."""


class TransientError(TombstoneError):
    """A temporary failure before anything was written or sent: the job is retried with backoff."""


class LeaseLost(TombstoneError):
    """The job's lease was taken over: this worker must write nothing more for it."""


class InvalidResult(InvalidParams):
    """A task's return value is kept only as JSON of plain values, free of personal values."""


class UnfencedTask(MissingFence, TypeError):
    """This task is fenced (a fence named, or a parameter typed as a TombstoneModel): it needs
    the record it is for among its arguments, not its pk."""


class NoRecord(UnfencedWrite, TypeError):
    """A plain task runs for no record: it has no fenced write (update, write) to make."""


# How a job that did not succeed reads as a TaskResult's error (tombstones.tasks): the classes
# of the outcomes no other exception here names.
class JobFailed(TombstoneError):
    """The job failed: its handler raised or ran out of attempts, and nothing it wrote was kept."""


class JobExpired(TombstoneError):
    """The job waited longer than TOMBSTONES_JOB_MAX_AGE and was not run."""


class JobCancelled(TombstoneError):
    """Staff cancelled the job before it ran."""


class JobSuperseded(TombstoneError):
    """A newer job of the same coalescing handler (or task) for the same record was queued
    before this one started: it never ran (``superseded`` / ``coalesced``)."""


class OutcomeUncertain(TombstoneError):
    """An external call may or may not have landed: it is never repeated by itself."""


class UnknownQueue(TombstoneError, ValueError):
    """A job's queue must be "default", a key of TOMBSTONES_QUEUES or in a TombstoneBackend's
    QUEUES."""
