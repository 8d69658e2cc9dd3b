"""The record's lifecycle writes: insert, fenced save, queryset update, tombstone, recreate, purge.

Each returns a row count (or the instance) and, when the caller asks for it, raises a typed error
from :mod:`tombstones.exceptions` built from ids and numbers only. The handler's fences are in
:mod:`.fencing`.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable
from typing import Any

from django.db import IntegrityError, connections, models, transaction
from django.db.models import F
from django.db.models.functions import Now

from ..exceptions import AlreadyLive, MissingFence, ProtectedField, RecordDeleted
from ..signals import record_tombstoned, records_purged
from . import rows
from .fencing import Fence, conflict_error, observe
from .fields import FencedFields
from .options import PROTECTED_FIELDS, erased_value, get_options, refuse_identity

PK_CHUNK = rows.PK_CHUNK  # pks per statement when rows are written by pk


# The fence of every write of live rows.
LIVE = {"deleted_at__isnull": True}


def _require_fence(instance: FencedFields) -> None:
    # A deferred generation/version would be fetched fresh on first access, and a fence built
    # from the current row always matches: refuse rather than overwrite blindly.
    if PROTECTED_FIELDS & instance.get_deferred_fields():
        raise MissingFence(model=type(instance)._meta.label, pk=instance.pk)


def _erasures(model: type[models.Model]) -> rows.UpdateValues:
    values: rows.UpdateValues = []
    for name in get_options(model).personal_fields:
        field = rows.field(model, name)
        values.append((field, None, erased_value(field)))
    return values


def insert(instance: FencedFields, *, using: str | None = None) -> None:
    """INSERT a brand-new record at generation 1, version 1.

    A business key held by a tombstone is refused: reviving it is ``recreate()``'s job.
    """
    model = type(instance)
    key = get_options(model).business_key
    db = rows.write_db(model, using, instance)
    if key is not None:
        value = getattr(instance, rows.field(model, key).attname)
        held = rows.plain(model, db).filter(**{key: value}, deleted_at__isnull=False)
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
    # Every table INSERTs, a multi-table child's parents' too: a parent pk set on a new child
    # must not turn into an unfenced UPDATE of that parent's row (its fence fields included).
    tables = (model, *model._meta.get_parent_list())
    models.Model.save(instance, force_insert=tables, using=db)


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
    attname = rows.field(model, key).attname
    values = list(dict.fromkeys(v for r in records if (v := getattr(r, attname)) is not None))
    db = rows.write_db(model, using)
    # One query for all keys (split only where the backend limits parameters, e.g. SQLite).
    size = max(connections[db].ops.bulk_batch_size([attname], values), 1)
    for start in range(0, len(values), size):
        held = (
            rows.plain(model, db)
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
    instance: FencedFields,
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
    db = rows.write_db(model, using, instance)
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
    values: rows.UpdateValues = [(f, None, f.pre_save(instance, False)) for f in fields]
    values.append((rows.field(model, "version"), None, F("version") + 1))
    fence = Fence.of(instance)
    matched = rows.fenced_update(fence.rows(db), values, fence.lookups())
    if matched != 1:
        raise conflict_error(fence, observe(fence, using=db))
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
    refuse_identity(queryset.model, kwargs)
    live = queryset.filter(**LIVE)
    model = queryset.model
    if not model._meta.parents:
        return models.QuerySet.update(live, version=F("version") + 1, **kwargs)
    # A multi-table child: its fields in several tables, the fence in one of them.
    values = rows.update_values(model, {**kwargs, "version": F("version") + 1})
    return rows.fenced_update(live, values, LIVE)


def _tombstone_values(model: type[models.Model]) -> rows.UpdateValues:
    return [
        (rows.field(model, "deleted_at"), None, Now()),
        (rows.field(model, "version"), None, F("version") + 1),
        *_erasures(model),
    ]


def _locked_pks(model: type[models.Model], queryset: models.QuerySet[Any]) -> list[Any]:
    # A plain queryset over the matched pks: FOR UPDATE then locks the model's rows only, even
    # when the caller's queryset joins other tables.
    locked = rows.plain(model, queryset.db).filter(pk__in=queryset.values("pk")).select_for_update()
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
        return rows.fenced_update(live, values, LIVE)
    db = live.db
    with transaction.atomic(using=db):
        pks = _locked_pks(model, live)
        count = 0
        for chunk in rows.chunks(pks):
            still_live = rows.plain(model, db).filter(pk__in=chunk, **LIVE)
            count += rows.fenced_update(still_live, values, LIVE)
        if pks:
            record_tombstoned.send(sender=model, pks=pks, using=db)
    return count


def tombstone_instance(instance: FencedFields, *, using: str | None = None) -> int:
    """Tombstone one record, fenced on its generation: a stale instance can't delete a newer one."""
    model = type(instance)
    if instance.pk is None:
        raise ValueError(f"{model._meta.object_name} object can't be deleted: its pk is None.")
    _require_fence(instance)
    db = rows.write_db(model, using, instance)
    qs = rows.plain(model, db).filter(pk=instance.pk, generation=instance.generation)
    # One transaction: the read-back must see this UPDATE's row, not a concurrent recreate(), and
    # the signal's receivers write with the deletion or not at all.
    with transaction.atomic(using=db):
        if connections[db].features.has_select_for_update:
            # Wait for a job that holds the row (it wrote) before the UPDATE starts: deleted_at
            # is the UPDATE's statement time, never earlier than that job's commit.
            locked = qs.filter(deleted_at__isnull=True).select_for_update(no_key=True)
            list(locked.values_list("pk"))
        fence = {"generation": instance.generation, **LIVE}
        count = rows.fenced_update(qs.filter(**LIVE), _tombstone_values(model), fence)
        if count:
            fresh = qs.values_list("version", "deleted_at").get()
            record_tombstoned.send(sender=model, pks=[instance.pk], using=db)
    if count:
        instance.version, instance.deleted_at = fresh
        for field, _, value in _erasures(model):
            setattr(instance, field.attname, value)
    return count


def recreate(model: type[FencedFields], fields: dict[str, Any], *, using: str | None) -> Any:
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
    db = rows.write_db(model, using)
    with transaction.atomic(using=db):
        row = (
            rows.plain(model, db)
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
        values: rows.UpdateValues = [
            (f, None, f.pre_save(fresh, True))
            for f in model._meta.concrete_fields
            if not f.primary_key and f.name not in PROTECTED_FIELDS
        ]
        values += [
            (rows.field(model, "generation"), None, generation + 1),
            (rows.field(model, "version"), None, 1),
            (rows.field(model, "deleted_at"), None, None),
        ]
        fence = {"generation": generation, "deleted_at__isnull": False}
        dead = rows.plain(model, db).filter(pk=pk, **fence)
        revived = rows.fenced_update(dead, values, fence)
        if revived != 1:
            raise AlreadyLive(model=model._meta.label, pk=pk, found_generation=generation)
    fresh.generation, fresh.version, fresh.deleted_at = generation + 1, 1, None
    for parent in model._meta.get_parent_list():  # a multi-table child: its parents' pks too
        setattr(fresh, parent._meta.pk.attname, rows.table_pks(model, parent, [pk], db)[0])
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
        for chunk in rows.chunks(pks):
            part = rows.plain(model, db).filter(pk__in=chunk, deleted_at__isnull=False)
            deleted += _delete_tombstones(model, part)
        if pks:
            records_purged.send(sender=model, pks=pks, using=db)
    return deleted


def purge_blockers(queryset: models.QuerySet[Any]) -> list[str]:
    """What keeps these tombstones from being purged alone: one phrase per related model, such
    as ``"customers.SheetRow: 1 live row, on_delete=PROTECT"``; empty when nothing does.

    Django's own ``Collector`` finds the related rows, as it would for the delete: ``PROTECT``
    and ``RESTRICT`` rows, and rows the delete would cascade to. :func:`purge` refuses exactly
    when this is not empty, and ``purge_tombstones`` asks it before its dry run and its real run
    alike, so both keep the same tombstones. Labels and counts only: no row's values.
    """
    from django.db.models.deletion import Collector

    model = queryset.model
    dead = models.QuerySet.filter(queryset, deleted_at__isnull=False)
    collector = Collector(using=dead.db, origin=dead)
    try:
        collector.collect(dead)
    except models.ProtectedError as exc:
        return _blocker_phrases(exc.protected_objects, "PROTECT")
    except models.RestrictedError as exc:
        return _blocker_phrases(exc.restricted_objects, "RESTRICT")
    cascaded: list[Any] = [
        obj for m, objs in collector.data.items() if m is not model for obj in objs
    ]
    phrases = _blocker_phrases(cascaded, "CASCADE")
    for fast in collector.fast_deletes:
        count = fast.count() if fast.model is not model else 0
        if count:
            phrases.append(f"{fast.model._meta.label}: {count} row(s), on_delete=CASCADE")
    return phrases


def _blocker_phrases(objs: Iterable[Any], how: str) -> list[str]:
    live: Counter[str] = Counter()
    dead: Counter[str] = Counter()
    for obj in objs:
        label = obj._meta.label
        if getattr(obj, "deleted_at", None) is None:
            live[label] += 1
        else:
            dead[label] += 1
    phrases = []
    for label in sorted(live.keys() | dead.keys()):
        parts = [
            f"{n} {kind}"
            for n, kind in ((live[label], "live row(s)"), (dead[label], "tombstone(s)"))
            if n
        ]
        phrases.append(f"{label}: {', '.join(parts)}, on_delete={how}")
    return phrases


def _delete_tombstones(model: type[models.Model], dead: models.QuerySet[Any]) -> int:
    blockers = purge_blockers(dead)
    if blockers:
        raise models.ProtectedError(
            f"Purging {model._meta.label} tombstones would delete or orphan other rows "
            f"({'; '.join(blockers)}); tombstone, delete or detach those first.",
            set(),
        )
    deleted, _ = models.QuerySet.delete(dead)
    return int(deleted)
