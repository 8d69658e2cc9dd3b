"""The race harness's models: the source of truth, the downstream store, and the delivery log."""

from __future__ import annotations

from django.db import models
from django.db.models.functions import Now

from tombstones.models import TombstoneModel


class StressEntity(TombstoneModel):
    """The source of truth: an entity that is created, updated, deleted and re-created."""

    key = models.CharField(max_length=64, unique=True)  # business key
    payload = models.CharField(max_length=200)
    counter = models.PositiveIntegerField(default=0)  # read-modify-write jobs (stress.count)

    class TombstoneMeta:
        business_key = "key"
        personal_fields = ()

    class Meta:
        ordering = ("key",)

    def __str__(self) -> str:
        return f"Stress entity {self.key}"


class DownstreamRecord(models.Model):
    """The downstream system: blind upserts and deletes by business key, no conditional writes."""

    key = models.CharField(max_length=64, unique=True)
    payload = models.CharField(max_length=200)
    generation = models.PositiveIntegerField()

    class Meta:
        ordering = ("key",)

    def __str__(self) -> str:
        return f"Downstream {self.key}"


class Delivery(models.Model):
    """One row when a delivery starts and one when it ends: order, overlap and duplicates."""

    class Phase(models.TextChoices):
        START = "start"  # the handler began delivering
        END = "end"  # the downstream write was made

    job_id = models.BigIntegerField(db_index=True)
    lane = models.CharField(max_length=255, db_index=True)
    sequence = models.BigIntegerField(help_text="The job's position in its lane.")
    key = models.CharField(max_length=64, db_index=True)
    op = models.CharField(max_length=16)
    phase = models.CharField(max_length=8, choices=Phase)
    generation = models.PositiveIntegerField()
    worker = models.CharField(max_length=200, blank=True)
    created_at = models.DateTimeField(db_default=Now())

    class Meta:
        ordering = ("id",)

    def __str__(self) -> str:
        return f"Delivery {self.phase} job={self.job_id}"


class AppliedWrite(models.Model):
    """An internal write made inside a job's act-and-record transaction (crash tests count it)."""

    job_id = models.BigIntegerField(db_index=True)
    key = models.CharField(max_length=64)
    version = models.PositiveIntegerField()
    worker = models.CharField(max_length=200, blank=True)

    class Meta:
        ordering = ("id",)

    def __str__(self) -> str:
        return f"Applied write job={self.job_id}"


class Meter(TombstoneModel):
    """A record with a column the database computes (tests: what a job of a group sees)."""

    key = models.CharField(max_length=64, unique=True)
    reading = models.IntegerField(default=0)
    doubled = models.GeneratedField(
        expression=models.F("reading") * 2, output_field=models.IntegerField(), db_persist=True
    )

    class TombstoneMeta:
        business_key = "key"
        personal_fields = ()

    class Meta:
        ordering = ("key",)

    def __str__(self) -> str:
        return f"Meter {self.key}"


class Account(TombstoneModel):
    """A record with a subclass in a table of its own (multi-table inheritance: tests)."""

    number = models.BigAutoField(primary_key=True)  # a primary key not named "id"
    key = models.CharField(max_length=64, unique=True)  # business key
    holder = models.CharField(max_length=100, blank=True)  # personal

    class TombstoneMeta:
        business_key = "key"
        personal_fields = ("holder",)

    class Meta:
        ordering = ("key",)

    def __str__(self) -> str:
        return f"Account {self.key}"


class BusinessAccount(Account):
    """A multi-table child: its fence (generation, version, deleted_at) is in Account's table,
    its own fields (a personal one among them) in its own."""

    company = models.CharField(max_length=100, blank=True)
    contact_email = models.EmailField(blank=True)  # personal
    credits = models.IntegerField(default=0)

    class TombstoneMeta:
        business_key = "key"
        personal_fields = ("holder", "contact_email")

    def __str__(self) -> str:
        return f"Business account {self.key}"


class SoakEffect(models.Model):
    """The chaos soak's internal job write: inserted by the handler in its act transaction, so it
    commits with the job's fenced update and outcome, or not at all (project/stress/soak)."""

    job_id = models.BigIntegerField(db_index=True)
    entity_id = models.BigIntegerField()
    generation = models.PositiveIntegerField()
    version = models.PositiveIntegerField(help_text="The record's version after the write.")
    counter = models.PositiveIntegerField(help_text="The record's counter after the write.")
    claim = models.CharField(max_length=255, help_text="owner@claim time of the claim that ran it.")

    class Meta:
        ordering = ("id",)
        indexes = [models.Index(fields=["entity_id", "generation"], name="stress_soak_effect_rec")]

    def __str__(self) -> str:
        return f"Soak effect job={self.job_id}"


class SoakEdit(models.Model):
    """A change made by the chaos soak's editor, written in the change's own transaction."""

    class Kind(models.TextChoices):
        EDIT = "edit"  # save() of a live record: version + 1
        DELETE = "delete"  # a tombstone: version + 1
        RECREATE = "recreate"  # generation + 1, version 1

    entity_id = models.BigIntegerField()
    generation = models.PositiveIntegerField()
    version = models.PositiveIntegerField(help_text="The record's version after the change.")
    kind = models.CharField(max_length=8, choices=Kind)
    created_at = models.DateTimeField(db_default=Now())

    class Meta:
        ordering = ("id",)
        indexes = [models.Index(fields=["entity_id", "generation"], name="stress_soak_edit_rec")]

    def __str__(self) -> str:
        return f"Soak {self.kind} entity={self.entity_id}"
