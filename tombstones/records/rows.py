"""Row-level helpers both write modules share: a plain queryset, the raw UPDATE, the write database.

Below :mod:`.fencing` and :mod:`.writes`, so that neither imports the other's privates.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from django.core.exceptions import FieldError, ValidationError
from django.db import DatabaseError, connections, models, router, transaction

UpdateValues = list[tuple[Any, Any, Any]]  # (field, model, value) as QuerySet._update takes

# Pks per statement when rows are written by pk: far below every backend's parameter limit.
PK_CHUNK = 500


def plain(model: type[models.Model], using: str | None) -> models.QuerySet[Any]:
    """A plain QuerySet: the record querysets' own update()/delete() are overridden."""
    return models.QuerySet(model=model, using=using)


def raw_update(queryset: models.QuerySet[Any], values: UpdateValues) -> int:
    """QuerySet._update takes field objects (as Model.save does) and skips our update() override."""
    return int(queryset._update(values))  # type: ignore[attr-defined]


def field(model: type[models.Model], name: str) -> models.Field[Any, Any]:
    return model._meta.get_field(name)  # type: ignore[return-value]


def write_db(model: type[models.Model], using: str | None, instance: Any = None) -> str:
    return using or router.db_for_write(model, instance=instance)


def is_pk(model: type[models.Model], value: str, using: str) -> bool:
    """Whether ``value`` (a job's ``object_id``) converts to a value the model's primary key
    column holds. A row written by hand may hold anything ("abc" for an integer pk, a number
    beyond the column's range), and one such value must not break a query for other rows."""
    pk: Any = model._meta.pk
    connection = connections[using]
    try:
        converted = pk.to_python(value)
        pk.get_db_prep_value(converted, connection, prepared=False)
    except (ValidationError, ValueError, TypeError, OverflowError):
        return False
    while pk.remote_field is not None:  # a multi-table child's pk: its parent's link
        pk = pk.target_field
    if isinstance(pk, models.IntegerField) and isinstance(converted, int):
        low, high = connection.ops.integer_field_range(pk.get_internal_type())
        return (low is None or converted >= low) and (high is None or converted <= high)
    return converted is not None


def chunks(pks: list[Any]) -> Iterator[list[Any]]:
    for start in range(0, len(pks), PK_CHUNK):
        yield pks[start : start + PK_CHUNK]


def update_values(model: type[models.Model], fields: dict[str, Any]) -> UpdateValues:
    """``update(**fields)``'s names as ``(field, None, value)``, refused as Django refuses them."""
    values: UpdateValues = []
    for name, value in fields.items():
        found = model._meta.get_field(name)
        if not getattr(found, "concrete", False) or found.many_to_many:
            raise FieldError(
                f"Cannot update model field {found!r} (only non-relations and foreign keys "
                "permitted)."
            )
        values.append((found, None, value))
    return values


def fenced_update(
    queryset: models.QuerySet[Any], values: UpdateValues, fence: dict[str, Any], *guards: Any
) -> int:
    """UPDATE the rows of ``queryset`` with ``values``; the count of rows that matched.

    ``queryset`` filters on the fence already; ``fence`` repeats its lookups on the fence fields
    (generation, version, deleted_at) alone, ``guards`` its conditions on other tables
    (``Exists()`` of a source record), and ``values`` move one of the fence fields. A model of
    one table: one statement. A multi-table inheritance child keeps its fields in several tables
    and its fence in one of them, where an ``F("version")`` of the child's UPDATE cannot reach
    (and Django's own update() selects the pks, then updates each table by pk alone: the fence in
    no UPDATE). Here the rows are locked, the fence's table is updated first, still filtered on
    ``fence``, and the other tables follow by pk, in the same transaction.
    """
    model = queryset.model
    concrete = model._meta.concrete_model
    home: Any = field(model, "version").model._meta.concrete_model
    by_table: dict[Any, UpdateValues] = {}
    for value in values:
        by_table.setdefault(value[0].model._meta.concrete_model, []).append(value)
    if home is concrete and set(by_table) <= {concrete}:
        return raw_update(queryset, values)
    home_values = by_table.pop(home, [])
    if not home_values:
        raise ValueError("A fenced update moves generation, version or deleted_at.")
    db = queryset.db
    count = 0
    with transaction.atomic(using=db):
        # FOR NO KEY UPDATE re-checks the fence on the rows' latest state (PostgreSQL; on SQLite
        # the transaction holds the database's write lock): until the commit no other write
        # moves them, so the fence's UPDATE matches exactly these rows, and the other tables
        # follow for them alone.
        locked = (
            plain(model, db)
            .filter(*guards, pk__in=queryset.values("pk"), **fence)
            .select_for_update(no_key=True)
            .order_by("pk")
        )
        for chunk in chunks(list(locked.values_list("pk", flat=True))):
            pks = table_pks(model, home, chunk, db)
            fenced = plain(home, db).filter(*guards, pk__in=pks, **fence)
            matched = raw_update(fenced, home_values)
            if matched != len(chunk):  # the lock forbids it: never write the other tables blind
                raise DatabaseError(f"{model._meta.label}: locked rows left their fence.")
            for table, table_values in by_table.items():
                rows = plain(table, db).filter(pk__in=table_pks(model, table, chunk, db))
                raw_update(rows, table_values)
            count += matched
    return count


def table_pks(model: type[models.Model], table: Any, pks: list[Any], db: str) -> list[Any]:
    """The pks, in ``table`` (the model's own or an ancestor's), of the model's rows ``pks``."""
    path = model._meta.get_path_to_parent(table)
    if all(step.join_field.primary_key for step in path):
        return pks  # the parent links are the primary keys (single inheritance): the same values
    lookup = "__".join(step.join_field.name for step in path)
    return list(plain(model, db).filter(pk__in=pks).values_list(lookup, flat=True))
