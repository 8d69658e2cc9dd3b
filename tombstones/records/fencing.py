"""The handler's write fences: read a record against an expected (generation, version), and write
only while it is live at them.

With :mod:`.writes` (the record's own lifecycle), the only place that moves ``generation``,
``version`` or ``deleted_at``; errors are typed (:mod:`tombstones.exceptions`), built from ids and
numbers only.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import Any

from django.db import connections, models, router, transaction
from django.db.models import Exists, F, Q

from ..exceptions import (
    GenerationChanged,
    ProtectedField,
    RecordDeleted,
    RecordMissing,
    StaleVersion,
    TombstoneError,
)
from . import rows
from .options import PROTECTED_FIELDS, generated_fields, refuse_identity


class State(enum.StrEnum):
    """What one read of a record says, relative to an expected (generation, version)."""

    LIVE = "live"  # live, same generation, same version
    STALE = "stale"  # live, same generation, newer version: not a deletion
    TOMBSTONE = "tombstone"  # deleted at the expected generation
    GENERATION_CHANGED = "generation_changed"  # re-created (or deleted at a later generation)
    MISSING = "missing"  # neither record nor tombstone: purged or never existed


@dataclass(frozen=True)
class Observation:
    state: State
    generation: int | None = None
    version: int | None = None
    deleted: bool = False  # the row found is a tombstone (at whatever generation)


@dataclass(frozen=True)
class Fence:
    """What a job (or a save) expects of its record: this row, at this generation and version.

    ``version=None`` expects the generation only (an external call's checks, the params kept
    for staff). :meth:`lookups` is the one spelling of "live at the fence": the ORM's filters,
    the hand-written UPDATE and the external call's ``Exists`` are all built from it.
    """

    model: type[models.Model]
    pk: Any
    generation: int
    version: int | None = None

    @classmethod
    def of(cls, record: Any) -> Fence:
        """A record instance's own fence: its generation and version as read."""
        return cls(type(record), record.pk, record.generation, record.version)

    def values(self) -> dict[str, int]:
        """The fence's fields compared by value: its generation, and its version if it has one."""
        if self.version is None:
            return {"generation": self.generation}
        return {"generation": self.generation, "version": self.version}

    def lookups(self, *, live: bool = True) -> dict[str, Any]:
        """The fence's conditions on its own fields (without the pk).

        ``live=False`` (handlers that propagate deletions) drops "not deleted" only."""
        return {**self.values(), "deleted_at__isnull": True} if live else self.values()

    def q(self, *, live: bool = True) -> Q:
        """The fence as a filter: the row is pk, at the fence, and (``live``) not deleted."""
        return Q(pk=self.pk, **self.lookups(live=live))

    def rows(self, using: str | None, *, live: bool = True) -> models.QuerySet[Any]:
        """The record's row while it is at the fence (none otherwise), read through all rows
        (a plain QuerySet: with ``live=False`` a tombstone at the fence is found too)."""
        return rows.plain(self.model, using).filter(self.q(live=live))

    def stale(self) -> Observation:
        """A write that matched 0 rows of a record read as live: newer, never "fine"."""
        return Observation(State.STALE, self.generation, self.version)


def observe(fence: Fence, *, using: str | None = None) -> Observation:
    """One read of the record through all rows, classified against the fence."""
    model = fence.model
    row = (
        rows.plain(model, using or router.db_for_read(model))
        .filter(pk=fence.pk)
        .values_list("generation", "version", "deleted_at")
        .first()
    )
    if row is None:
        return Observation(State.MISSING)
    found_generation, found_version, deleted_at = row
    if found_generation != fence.generation:
        state = State.GENERATION_CHANGED
    elif deleted_at is not None:
        state = State.TOMBSTONE
    elif fence.version is not None and found_version != fence.version:
        state = State.STALE
    else:
        state = State.LIVE
    return Observation(state, found_generation, found_version, deleted_at is not None)


def as_stored(
    model: type[models.Model], fields: dict[str, Any]
) -> tuple[dict[str, Any], list[str]]:
    """The values an UPDATE of ``fields`` stores, as Python sees them after reading the row back,
    and the names whose stored value only the database knows (expressions; decimals, which it
    rounds; JSON; generated columns), to be read back."""
    values: dict[str, Any] = {}
    # Generated columns follow the fields they are computed from: read back with them.
    computed: list[str] = list(generated_fields(model))
    for name, value in fields.items():
        field = rows.field(model, name)
        if hasattr(value, "resolve_expression") or isinstance(
            field, models.DecimalField | models.JSONField
        ):
            computed.append(name)
        elif field.is_relation or value is None:
            values[name] = value
        else:
            values[name] = field.to_python(value)
    return values, computed


def read_fields(
    model: type[models.Model], pk: Any, names: list[str], *, using: str | None = None
) -> dict[str, Any]:
    """The current values of some of a record's fields (after a write computed them)."""
    attnames = {rows.field(model, n).attname: n for n in names}
    row = rows.plain(model, using).filter(pk=pk).values(*attnames).get()
    return {attnames[a]: v for a, v in row.items()}


def conflict_error(fence: Fence, seen: Observation) -> TombstoneError:
    """The typed error for a fenced write that matched 0 rows."""
    kinds: dict[State, type[TombstoneError]] = {
        State.TOMBSTONE: RecordDeleted,
        State.GENERATION_CHANGED: GenerationChanged,
        State.MISSING: RecordMissing,
    }
    return kinds.get(seen.state, StaleVersion)(
        model=fence.model._meta.label,
        pk=fence.pk,
        expected_generation=fence.generation,
        found_generation=seen.generation,
        expected_version=fence.version,
        found_version=seen.version,
    )


def update_record(fence: Fence, fields: dict[str, Any], *, using: str | None = None) -> int:
    """``filter(pk, generation, version, live).update(..., version + 1)``: 1 or 0 rows."""
    model, pk = fence.model, fence.pk
    if PROTECTED_FIELDS & set(fields):
        raise ProtectedField(model=model._meta.label, pk=pk)
    refuse_identity(model, fields, pk)
    db = rows.write_db(model, using)
    plain = _plain_update(fence, db, fields)
    if plain is not None:
        sql, params = plain
        with (
            transaction.mark_for_rollback_on_error(using=db),
            connections[db].cursor() as cursor,
        ):
            cursor.execute(sql, params)
            return int(cursor.rowcount)
    qs = fence.rows(db)
    if not model._meta.parents:
        return qs.update(version=F("version") + 1, **fields)
    # A multi-table child: its fields in several tables, the fence in one of them.
    values = rows.update_values(model, {**fields, "version": F("version") + 1})
    return rows.fenced_update(qs, values, fence.lookups())


# The fenced UPDATE of plain values, by (model, database vendor, fields, which are None): the
# handler's write is the engine's most frequent statement, and the ORM's building of it costs
# several times its round trip. Anything else (expressions, relations, inherited fields) takes
# the ORM's road.
_plain_updates: dict[tuple[Any, ...], tuple[str, list[models.Field[Any, Any]]] | None] = {}


def _plain_update(fence: Fence, db: str, fields: dict[str, Any]) -> tuple[str, list[Any]] | None:
    """``UPDATE ... SET version = version + 1, <fields> WHERE <fence>`` and its parameters, or
    None when a value or a field needs the ORM."""
    if any(
        hasattr(v, "resolve_expression") or hasattr(v, "prepare_database_save")
        for v in fields.values()
    ):
        return None
    model, connection = fence.model, connections[db]
    nulls = tuple(v is None for v in fields.values())
    key = (model, connection.vendor, tuple(fields), nulls, fence.version is None)
    if key not in _plain_updates:
        if len(_plain_updates) > 512:
            _plain_updates.clear()
        _plain_updates[key] = _plain_update_sql(fence, connection, list(fields), nulls)
    found = _plain_updates[key]
    if found is None:
        return None
    sql, targets = found
    values = [v for v in fields.values() if v is not None]
    params = [
        f.get_db_prep_save(v, connection=connection) for f, v in zip(targets, values, strict=True)
    ]
    pk_field = model._meta.pk
    assert pk_field is not None
    pk = pk_field.get_db_prep_value(fence.pk, connection, prepared=False)
    params += [pk, *fence.values().values()]
    return sql, params


def _plain_update_sql(
    fence: Fence, connection: Any, names: list[str], nulls: tuple[bool, ...]
) -> tuple[str, list[models.Field[Any, Any]]] | None:
    model = fence.model
    meta = model._meta
    if meta.parents or meta.pk is None:
        return None  # multi-table inheritance: the ORM updates each table
    qn = connection.ops.quote_name
    sets = [
        f"{qn(rows.field(model, 'version').column)} = {qn(rows.field(model, 'version').column)} + 1"
    ]
    targets: list[models.Field[Any, Any]] = []
    for name, null in zip(names, nulls, strict=True):
        try:
            found = meta.get_field(name)
        except Exception:  # noqa: BLE001 - an unknown name: the ORM raises its own error
            return None
        if not isinstance(found, models.Field):
            return None  # a reverse relation
        field: models.Field[Any, Any] = found
        if (
            not getattr(field, "concrete", False)
            or field.many_to_many
            or field.primary_key
            or field.model is not model
            or field.name != name
            or hasattr(field, "get_placeholder")
            or getattr(field, "generated", False)
            or field.is_relation
        ):
            return None
        if null:
            sets.append(f"{qn(field.column)} = NULL")
        else:
            sets.append(f"{qn(field.column)} = %s")
            targets.append(field)
    # The fence's fields by value, in their order (the parameters follow the same order), and
    # not deleted: Fence.lookups() as SQL.
    where = [f"{qn(meta.pk.column)} = %s"]
    where += [f"{qn(rows.field(model, name).column)} = %s" for name in fence.values()]
    where.append(f"{qn(rows.field(model, 'deleted_at').column)} IS NULL")
    return f"UPDATE {qn(meta.db_table)} SET {', '.join(sets)} WHERE {' AND '.join(where)}", targets


def share_lock(fence: Fence, *, live: bool = True, using: str | None = None) -> bool | None:
    """PostgreSQL: share-lock the source row if it is at the fence, until the commit.

    Right before a write of another table (``ctx.write``): from then on a delete or re-create
    of the record waits for the job's commit, so no write commits after the record died; a
    delete committed before makes this False. None where no lock is needed (SQLite: the
    transaction holds the database's write lock already).
    """
    db = rows.write_db(fence.model, using)
    connection = connections[db]
    if connection.vendor != "postgresql":
        return None
    at = fence.rows(db, live=live)
    sql, params = at.values_list("pk").query.get_compiler(using=db).as_sql()
    with connection.cursor() as cursor:
        cursor.execute(f"{sql} FOR SHARE", params)
        return cursor.fetchone() is not None


def write_related(
    queryset: models.QuerySet[Any], fence: Fence, fields: dict[str, Any], *, live: bool = True
) -> int:
    """UPDATE rows of another table only while the source record is live at (generation, version).

    The Exists() is part of the same statement, so a deletion committed before the write makes it
    match 0 rows. A target that is itself a tombstoned model gets version + 1; its dead rows stay.
    """
    source = Exists(fence.rows(queryset.db, live=live))
    guarded = models.QuerySet.filter(queryset, source)
    target = queryset.model
    extra: dict[str, Any] = {}
    if {f.name for f in target._meta.concrete_fields} >= PROTECTED_FIELDS:
        if PROTECTED_FIELDS & set(fields):
            raise ProtectedField(model=target._meta.label)
        refuse_identity(target, fields)
        guarded = guarded.filter(deleted_at__isnull=True)
        extra["version"] = F("version") + 1
        if target._meta.parents:  # a multi-table child: the fence in one of its tables
            values = rows.update_values(target, {**fields, **extra})
            return rows.fenced_update(guarded, values, {"deleted_at__isnull": True}, source)
    return models.QuerySet.update(guarded, **fields, **extra)
