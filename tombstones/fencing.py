"""The one module that issues every statement moving ``generation``, ``version`` or ``deleted_at``.

Each function returns a row count (or the instance) and, when the caller asks for it, raises a
typed error from :mod:`tombstones.exceptions` built from ids and numbers only.
"""

from __future__ import annotations

import enum
from collections.abc import Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from django.db import IntegrityError, connections, models, router, transaction
from django.db.models import Exists, F, Q
from django.db.models.functions import Now

from .exceptions import (
    AlreadyLive,
    GenerationChanged,
    MissingFence,
    ProtectedField,
    RecordDeleted,
    RecordMissing,
    StaleVersion,
    TombstoneError,
)
from .options import PROTECTED_FIELDS, erased_value, generated_fields, get_options
from .signals import record_tombstoned, records_purged

if TYPE_CHECKING:
    from .records import TombstoneModel

_UpdateValues = list[tuple[Any, Any, Any]]  # (field, model, value) as QuerySet._update takes

# Pks per statement when rows are written by pk: far below every backend's parameter limit.
PK_CHUNK = 500


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


def _plain(model: type[models.Model], using: str | None) -> models.QuerySet[Any]:
    # A plain QuerySet: the record querysets' own update()/delete() are overridden.
    return models.QuerySet(model=model, using=using)


def _raw_update(queryset: models.QuerySet[Any], values: _UpdateValues) -> int:
    # QuerySet._update takes field objects (as Model.save does) and skips our update() override.
    return int(queryset._update(values))  # type: ignore[attr-defined]


def _field(model: type[models.Model], name: str) -> models.Field[Any, Any]:
    return model._meta.get_field(name)  # type: ignore[return-value]


def _write_db(model: type[models.Model], using: str | None, instance: Any = None) -> str:
    return using or router.db_for_write(model, instance=instance)


def observe(
    model: type[models.Model],
    pk: Any,
    generation: int | None,
    version: int | None,
    *,
    using: str | None = None,
) -> Observation:
    """One read of the record through all rows, classified against the expectation."""
    row = (
        _plain(model, using or router.db_for_read(model))
        .filter(pk=pk)
        .values_list("generation", "version", "deleted_at")
        .first()
    )
    if row is None:
        return Observation(State.MISSING)
    found_generation, found_version, deleted_at = row
    if generation is not None and found_generation != generation:
        state = State.GENERATION_CHANGED
    elif deleted_at is not None:
        state = State.TOMBSTONE
    elif version is not None and found_version != version:
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
        field = _field(model, name)
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
    attnames = {_field(model, n).attname: n for n in names}
    row = _plain(model, using).filter(pk=pk).values(*attnames).get()
    return {attnames[a]: v for a, v in row.items()}


def conflict_error(
    model: type[models.Model], pk: Any, generation: int, version: int, seen: Observation
) -> TombstoneError:
    """The typed error for a fenced write that matched 0 rows."""
    kinds: dict[State, type[TombstoneError]] = {
        State.TOMBSTONE: RecordDeleted,
        State.GENERATION_CHANGED: GenerationChanged,
        State.MISSING: RecordMissing,
    }
    return kinds.get(seen.state, StaleVersion)(
        model=model._meta.label,
        pk=pk,
        expected_generation=generation,
        found_generation=seen.generation,
        expected_version=version,
        found_version=seen.version,
    )


def _require_fence(instance: TombstoneModel) -> None:
    # A deferred generation/version would be fetched fresh on first access, and a fence built
    # from the current row always matches: refuse rather than overwrite blindly.
    if PROTECTED_FIELDS & instance.get_deferred_fields():
        raise MissingFence(model=type(instance)._meta.label, pk=instance.pk)


def _erasures(model: type[models.Model]) -> _UpdateValues:
    values: _UpdateValues = []
    for name in get_options(model).personal_fields:
        field = _field(model, name)
        values.append((field, None, erased_value(field)))
    return values


# --- records --------------------------------------------------------------------------------


def insert(instance: TombstoneModel, *, using: str | None = None) -> None:
    """INSERT a brand-new record at generation 1, version 1.

    A business key held by a tombstone is refused: reviving it is ``recreate()``'s job.
    """
    model = type(instance)
    key = get_options(model).business_key
    db = _write_db(model, using, instance)
    if key is not None:
        value = getattr(instance, _field(model, key).attname)
        held = _plain(model, db).filter(**{key: value}, deleted_at__isnull=False)
        tomb = held.values_list("pk", "generation", "version").first()
        if tomb is not None:
            raise RecordDeleted(
                "A tombstone holds this business key; use all_objects.recreate() to revive it "
                f"as a new generation ({model._meta.label} pk={tomb[0]}).",
                model=model._meta.label,
                pk=tomb[0],
                found_generation=tomb[1],
                found_version=tomb[2],
            )
    instance.generation = 1
    instance.version = 1
    instance.deleted_at = None
    models.Model.save(instance, force_insert=True, using=db)


def check_new_records(
    model: type[models.Model], records: list[Any], *, using: str | None = None
) -> None:
    """bulk_create()'s rule: only new records, and no business key a tombstone holds.

    Refuses (rather than resets) a generation, version or deleted_at that is not the fresh value:
    such an object was copied from another row, and storing it would forge an identity.
    """
    label = model._meta.label
    for record in records:
        if (record.generation, record.version, record.deleted_at) != (1, 1, None):
            raise ProtectedField(
                "bulk_create() stores new records only (generation 1, version 1, not deleted); "
                "use all_objects.recreate() to revive a business key.",
                model=label,
                pk=record.pk,
            )
    key = get_options(model).business_key
    if key is None or not records:
        return
    attname = _field(model, key).attname
    values = list(dict.fromkeys(v for r in records if (v := getattr(r, attname)) is not None))
    db = _write_db(model, using)
    # One query for all keys (split only where the backend limits parameters, e.g. SQLite).
    size = max(connections[db].ops.bulk_batch_size([attname], values), 1)
    for start in range(0, len(values), size):
        held = (
            _plain(model, db)
            .filter(**{f"{attname}__in": values[start : start + size]}, deleted_at__isnull=False)
            .values_list("pk", "generation", "version")
            .first()
        )
        if held is not None:
            raise RecordDeleted(
                "A tombstone holds one of these business keys; use all_objects.recreate() to "
                f"revive it as a new generation ({label} pk={held[0]}).",
                model=label,
                pk=held[0],
                found_generation=held[1],
                found_version=held[2],
            )


def save(
    instance: TombstoneModel,
    *,
    update_fields: Any = None,
    using: str | None = None,
) -> None:
    """Fenced UPDATE of an existing record: matches (pk, generation, version, live), bumps version.

    Raises RecordDeleted / GenerationChanged / StaleVersion / RecordMissing on 0 rows; never
    falls back to INSERT.
    """
    model = type(instance)
    _require_fence(instance)
    if instance.deleted_at is not None:
        raise RecordDeleted(
            model=model._meta.label, pk=instance.pk, expected_generation=instance.generation
        )
    db = _write_db(model, using, instance)
    writable = {
        name
        for f in model._meta.concrete_fields
        if not f.primary_key
        for name in (f.name, f.attname)
    }
    deferred = instance.get_deferred_fields()
    if update_fields is not None:
        if not update_fields:
            return  # Django's contract: an empty update_fields saves nothing
        unknown = set(update_fields) - writable
        if unknown:
            raise ValueError(
                "The following fields do not exist in this model, are m2m fields, primary keys, "
                f"or are non-concrete fields: {', '.join(sorted(unknown))}"
            )
    elif deferred and db == instance._state.db:
        # As Model.save does: write the loaded fields only, not one SELECT per deferred field.
        update_fields = frozenset(writable - deferred)
    # The mixin's fields are the fence itself (the row matches the instance's generation and
    # version and is live), so naming them in update_fields -- update_or_create() adds
    # deleted_at, a DateTimeField -- writes nothing: version is bumped below.
    names = None if update_fields is None else set(update_fields)
    fields = [
        f
        for f in model._meta.concrete_fields
        if not f.primary_key
        and f.name not in PROTECTED_FIELDS
        and (names is None or f.name in names or f.attname in names)
    ]
    models.signals.pre_save.send(
        sender=model, instance=instance, raw=False, using=db, update_fields=update_fields
    )
    values: _UpdateValues = [(f, None, f.pre_save(instance, False)) for f in fields]
    values.append((_field(model, "version"), None, F("version") + 1))
    fenced = _plain(model, db).filter(
        pk=instance.pk,
        generation=instance.generation,
        version=instance.version,
        deleted_at__isnull=True,
    )
    matched = _raw_update(fenced, values)
    if matched != 1:
        seen = observe(model, instance.pk, instance.generation, instance.version, using=db)
        raise conflict_error(model, instance.pk, instance.generation, instance.version, seen)
    instance.version += 1
    instance._state.db = db
    models.signals.post_save.send(
        sender=model,
        instance=instance,
        created=False,
        raw=False,
        using=db,
        update_fields=update_fields,
    )


def update_live(queryset: models.QuerySet[Any], kwargs: dict[str, Any]) -> int:
    """Queryset update(): live rows only, version + 1; the mixin's fields are refused."""
    if PROTECTED_FIELDS & set(kwargs):
        raise ProtectedField(model=queryset.model._meta.label)
    live = queryset.filter(deleted_at__isnull=True)
    return models.QuerySet.update(live, version=F("version") + 1, **kwargs)


def _tombstone_values(model: type[models.Model]) -> _UpdateValues:
    return [
        (_field(model, "deleted_at"), None, Now()),
        (_field(model, "version"), None, F("version") + 1),
        *_erasures(model),
    ]


def _chunks(pks: list[Any]) -> Iterator[list[Any]]:
    for start in range(0, len(pks), PK_CHUNK):
        yield pks[start : start + PK_CHUNK]


def _locked_pks(model: type[models.Model], queryset: models.QuerySet[Any]) -> list[Any]:
    # A plain queryset over the matched pks: FOR UPDATE then locks the model's rows only, even
    # when the caller's queryset joins other tables.
    locked = _plain(model, queryset.db).filter(pk__in=queryset.values("pk")).select_for_update()
    return list(locked.order_by("pk").values_list("pk", flat=True))


def tombstone(queryset: models.QuerySet[Any]) -> int:
    """Make tombstones of the live rows of ``queryset``; returns the count.

    One UPDATE. When ``record_tombstoned`` has receivers (the app is installed), the rows are
    locked and their pks read first, so the signal names exactly the records this call
    tombstoned; it is sent in the same transaction.
    """
    model = queryset.model
    live = queryset.filter(deleted_at__isnull=True)
    values = _tombstone_values(model)
    if not record_tombstoned.has_listeners(model):
        return _raw_update(live, values)
    db = live.db
    with transaction.atomic(using=db):
        pks = _locked_pks(model, live)
        count = 0
        for chunk in _chunks(pks):
            count += _raw_update(
                _plain(model, db).filter(pk__in=chunk, deleted_at__isnull=True), values
            )
        if pks:
            record_tombstoned.send(sender=model, pks=pks, using=db)
    return count


def tombstone_instance(instance: TombstoneModel, *, using: str | None = None) -> int:
    """Tombstone one record, fenced on its generation: a stale instance can't delete a newer one."""
    model = type(instance)
    if instance.pk is None:
        raise ValueError(f"{model._meta.object_name} object can't be deleted: its pk is None.")
    _require_fence(instance)
    db = _write_db(model, using, instance)
    qs = _plain(model, db).filter(pk=instance.pk, generation=instance.generation)
    # One transaction: the read-back must see this UPDATE's row, not a concurrent recreate(), and
    # the signal's receivers write with the deletion or not at all.
    with transaction.atomic(using=db):
        if connections[db].features.has_select_for_update:
            # Wait for a job that holds the row (it wrote) before the UPDATE starts: deleted_at
            # is the UPDATE's statement time, never earlier than that job's commit.
            locked = qs.filter(deleted_at__isnull=True).select_for_update(no_key=True)
            list(locked.values_list("pk"))
        count = _raw_update(qs.filter(deleted_at__isnull=True), _tombstone_values(model))
        if count:
            fresh = qs.values_list("version", "deleted_at").get()
            record_tombstoned.send(sender=model, pks=[instance.pk], using=db)
    if count:
        instance.version, instance.deleted_at = fresh
        for field, _, value in _erasures(model):
            setattr(instance, field.attname, value)
    return count


def recreate(model: type[TombstoneModel], fields: dict[str, Any], *, using: str | None) -> Any:
    """Revive the tombstone holding the business key as generation + 1, version 1.

    Creates generation 1 when no row holds the key; raises AlreadyLive when a live one does.
    """
    key = get_options(model).business_key
    if key is None:
        raise TypeError(f"{model._meta.label} declares no TombstoneMeta.business_key.")
    if key not in fields:
        raise TypeError(f"recreate() needs the business key {key!r} of {model._meta.label}.")
    if PROTECTED_FIELDS & set(fields):
        raise ProtectedField(model=model._meta.label)
    db = _write_db(model, using)
    with transaction.atomic(using=db):
        row = (
            _plain(model, db)
            .select_for_update()
            .filter(**{key: fields[key]})
            .values_list("pk", "generation", "version", "deleted_at")
            .first()
        )
        fresh = model(**fields)
        if row is None:
            try:
                with transaction.atomic(using=db):
                    insert(fresh, using=db)
            except IntegrityError:
                # A concurrent recreate() inserted the key first: it won.
                raise AlreadyLive(model=model._meta.label) from None
            return fresh
        pk, generation, version, deleted_at = row
        if deleted_at is None:
            raise AlreadyLive(
                model=model._meta.label, pk=pk, found_generation=generation, found_version=version
            )
        fresh.pk = pk
        values: _UpdateValues = [
            (f, None, f.pre_save(fresh, True))
            for f in model._meta.concrete_fields
            if not f.primary_key and f.name not in PROTECTED_FIELDS
        ]
        values += [
            (_field(model, "generation"), None, generation + 1),
            (_field(model, "version"), None, 1),
            (_field(model, "deleted_at"), None, None),
        ]
        dead = _plain(model, db).filter(pk=pk, generation=generation, deleted_at__isnull=False)
        revived = _raw_update(dead, values)
        if revived != 1:
            raise AlreadyLive(model=model._meta.label, pk=pk, found_generation=generation)
    fresh.generation, fresh.version, fresh.deleted_at = generation + 1, 1, None
    fresh._state.adding = False
    fresh._state.db = db
    return fresh


def purge(queryset: models.QuerySet[Any]) -> int:
    """Hard-delete tombstones (never live rows). Retention is the caller's (the command's) job.

    Refuses (ProtectedError) when Django's delete would cascade to any other row: a purge must
    never hard-delete a live child through on_delete=CASCADE. ``records_purged`` names the
    removed pks, in the same transaction.
    """
    model = queryset.model
    dead = models.QuerySet.filter(queryset, deleted_at__isnull=False)
    db = dead.db
    with transaction.atomic(using=db):
        if not records_purged.has_listeners(model):
            return _delete_tombstones(model, dead)
        pks = _locked_pks(model, dead)
        deleted = 0
        for chunk in _chunks(pks):
            part = _plain(model, db).filter(pk__in=chunk, deleted_at__isnull=False)
            deleted += _delete_tombstones(model, part)
        if pks:
            records_purged.send(sender=model, pks=pks, using=db)
    return deleted


def _delete_tombstones(model: type[models.Model], dead: models.QuerySet[Any]) -> int:
    from django.db.models.deletion import Collector

    collector = Collector(using=dead.db, origin=dead)
    collector.collect(dead)
    others = [m for m, objs in collector.data.items() if m is not model and objs]
    cascades = [qs for qs in collector.fast_deletes if qs.model is not model and qs.exists()]
    if others or cascades:
        raise models.ProtectedError(
            f"Purging {model._meta.label} tombstones would cascade to other rows; "
            "tombstone or detach those first.",
            set(),
        )
    deleted, _ = models.QuerySet.delete(dead)
    return int(deleted)


# --- job writes -----------------------------------------------------------------------------


def live_at(
    model: type[models.Model], pk: Any, generation: int, version: int, *, live: bool = True
) -> Q:
    """The fence: the row is pk, at this generation and version, and live.

    ``live=False`` (handlers that propagate deletions) drops the last condition only.
    """
    fence = Q(pk=pk, generation=generation, version=version)
    return fence & Q(deleted_at__isnull=True) if live else fence


def update_record(
    model: type[models.Model],
    pk: Any,
    generation: int,
    version: int,
    fields: dict[str, Any],
    *,
    using: str | None = None,
) -> int:
    """``filter(pk, generation, version, live).update(..., version + 1)``: 1 or 0 rows."""
    if PROTECTED_FIELDS & set(fields):
        raise ProtectedField(model=model._meta.label, pk=pk)
    qs = _plain(model, _write_db(model, using)).filter(live_at(model, pk, generation, version))
    return qs.update(version=F("version") + 1, **fields)


def hold(
    model: type[models.Model],
    pk: Any,
    generation: int,
    version: int,
    *,
    live: bool = True,
    using: str | None = None,
) -> bool | None:
    """PostgreSQL: share-lock the source row if it is at the fence, until the commit.

    Right before a write of another table (``ctx.write``): from then on a delete or re-create
    of the record waits for the job's commit, so no write commits after the record died; a
    delete committed before makes this False. None where no lock is needed (SQLite: the
    transaction holds the database's write lock already).
    """
    db = _write_db(model, using)
    connection = connections[db]
    if connection.vendor != "postgresql":
        return None
    fence = _plain(model, db).filter(live_at(model, pk, generation, version, live=live))
    sql, params = fence.values_list("pk").query.get_compiler(using=db).as_sql()
    with connection.cursor() as cursor:
        cursor.execute(f"{sql} FOR SHARE", params)
        return cursor.fetchone() is not None


def write_related(
    queryset: models.QuerySet[Any],
    model: type[models.Model],
    pk: Any,
    generation: int,
    version: int,
    fields: dict[str, Any],
    *,
    live: bool = True,
) -> int:
    """UPDATE rows of another table only while the source record is live at (generation, version).

    The Exists() is part of the same statement, so a deletion committed before the write makes it
    match 0 rows. A target that is itself a tombstoned model gets version + 1; its dead rows stay.
    """
    source = _plain(model, queryset.db).filter(live_at(model, pk, generation, version, live=live))
    guarded = models.QuerySet.filter(queryset, Exists(source))
    target = queryset.model
    extra: dict[str, Any] = {}
    if {f.name for f in target._meta.concrete_fields} >= PROTECTED_FIELDS:
        if PROTECTED_FIELDS & set(fields):
            raise ProtectedField(model=target._meta.label)
        guarded = guarded.filter(deleted_at__isnull=True)
        extra["version"] = F("version") + 1
    return models.QuerySet.update(guarded, **fields, **extra)
