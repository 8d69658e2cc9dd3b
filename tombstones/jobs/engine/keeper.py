"""The lease keeper: a claim's lease covers its jobs for as long as this worker holds them.

A worker may hold a claim for longer than one lease (a batch of slow handlers, one long
handler). A daemon thread of the worker process renews the leases of every claim it holds, on its
own database connection, a third of a lease after the claim and every third of a lease after
that, so the renewals commit at once whatever transaction the handlers are in. A claim that ends
sooner (the usual case) costs no renewal. A worker that dies stops renewing, and its leases run
out.

The same thread watches each claim: one still held after ``WATCH_SECONDS`` is slow (a handler
runs long), so the claim's jobs whose turn has not come go back to the queue at once
(:func:`tombstones.ledger.give_back`) and a helper is called for whatever is due, so that no job
waits for another record's slow handler. (Not on SQLite: the slow handler's transaction holds the
database's write lock, so no other worker could run them meanwhile.)
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from collections.abc import Iterator

from django.db import DatabaseError, connections

from ...conf import tombstone_settings
from .. import ledger, queues, wakeups
from ..cluster import in_cluster_worker, runs_in_sync
from ..ledger import Claim
from ..models import Job

logger = logging.getLogger("tombstones")


# A claim held this long is slow: whatever became due meanwhile goes to another worker.
WATCH_SECONDS = 0.5


class LeaseKeeper:
    """The claims one process holds, renewed (and watched) by one daemon thread."""

    def __init__(self) -> None:
        # token -> (database alias, renew at, watch at)
        self._kept: dict[str, tuple[str, float, float]] = {}
        self._claims: dict[str, Claim] = {}
        self._changed = threading.Condition()
        self._thread: threading.Thread | None = None

    @staticmethod
    def _period() -> float:
        return tombstone_settings.LEASE.total_seconds() / 3

    @contextlib.contextmanager
    def keeping(self, claim: Claim) -> Iterator[None]:
        """The claim's leases renewed, and the claim watched, until the block ends."""
        now = time.monotonic()
        with self._changed:
            self._kept[claim.token] = (claim.using, now + self._period(), now + WATCH_SECONDS)
            self._claims[claim.token] = claim
            if self._thread is None:
                self._thread = threading.Thread(
                    target=self._renew_forever, name="tombstones-leases", daemon=True
                )
                self._thread.start()
            self._changed.notify()
        try:
            yield
        finally:
            with self._changed:
                self._kept.pop(claim.token, None)
                self._claims.pop(claim.token, None)

    def kept(self) -> int:
        with self._changed:
            return len(self._kept)

    def _renew_forever(self) -> None:
        while True:
            with self._changed:
                now = time.monotonic()
                renew = {t: db for t, (db, at, _) in self._kept.items() if at <= now}
                watch = {t: db for t, (db, _, at) in self._kept.items() if at <= now}
                if not renew and not watch:
                    moments = [min(a, b) for _, a, b in self._kept.values()]
                    self._changed.wait(min(moments) - now if moments else None)
                    continue
                for token, (db, renew_at, watch_at) in list(self._kept.items()):
                    if token in renew:
                        renew_at = now + self._period()
                    if token in watch:
                        watch_at = float("inf")  # once per claim
                    self._kept[token] = (db, renew_at, watch_at)
            if renew:
                sent = time.monotonic()
                if self.renew(renew):
                    with self._changed:
                        renewed = [c for t in renew if (c := self._claims.get(t)) is not None]
                    for claim in renewed:
                        claim.extend(sent)
            with self._changed:
                slow = [c for t in watch if (c := self._claims.get(t)) is not None]
            for claim in slow:
                self.give_back(claim)
            again = {db: self.call_help(db) for db in set(watch.values())}
            with self._changed:
                for token, db in watch.items():
                    # A job due too briefly to call help for yet: look again when it is not.
                    entry, delay = self._kept.get(token), again[db]
                    if entry is not None and delay is not None:
                        self._kept[token] = (db, entry[1], time.monotonic() + delay)

    @staticmethod
    def give_back(claim: Claim) -> None:
        """A slow claim: the jobs whose turn has not come go to the other workers now."""
        if claim.workers < 2 or runs_in_sync() or connections[claim.using].vendor == "sqlite":
            return  # nobody else could run them sooner
        try:
            if ledger.give_back(claim):
                wakeups.call_helper()
        except Exception as exc:  # noqa: BLE001 - they run after the slow job instead
            logger.warning("could not hand over a slow claim's jobs (%s)", type(exc).__name__)
        finally:
            connections.close_all()

    @staticmethod
    def call_help(db: str) -> float | None:
        """A claim runs long: enqueues send messages again, and what is due goes to a helper.

        A job enqueued while the gate was closed has no message of its own: once it has been due
        for ``WATCH_SECONDS`` (sooner, this worker's claim may end and take it), a helper is
        called. Returns in how many seconds to look again, or None.
        """
        if not in_cluster_worker():
            return None  # nothing else would run it here (tests, commands driving the phases)
        try:
            wakeups.open_gate()
            oldest = Job.objects.using(db).oldest_hint_wait(queues.served())
            if oldest is None:
                return None  # what is enqueued from now on sends its own message
            if oldest.total_seconds() >= WATCH_SECONDS:
                wakeups.call_helper()  # a job has been due this long, and this worker is busy
                return None
            return WATCH_SECONDS - max(oldest.total_seconds(), 0.0)
        except Exception as exc:  # noqa: BLE001 - timers and the sweep remain
            logger.warning("could not call a helper for a long claim (%s)", type(exc).__name__)
            return None
        finally:
            connections.close_all()

    @staticmethod
    def renew(held: dict[str, str]) -> bool:
        """Renew these claims' leases; False if a renewal failed (their deadlines stay)."""
        by_db: dict[str, list[str]] = {}
        for token, db in held.items():
            by_db.setdefault(db, []).append(token)
        try:
            for db, tokens in by_db.items():
                ledger.renew(tokens, using=db)
        except DatabaseError as exc:
            # On SQLite the handlers' transaction may hold the write lock past the busy timeout;
            # nobody else can take the lease back meanwhile either. Next period tries again.
            logger.warning("lease renewal failed (%s); retrying", type(exc).__name__)
            return False
        finally:
            connections.close_all()  # this thread's own connections
        return True


def heartbeat(claim: Claim) -> bool:
    """Renew now, from a handler; False if another worker took the job over.

    Inside the act transaction the renewal must not wait for that transaction's commit: on
    PostgreSQL it runs on a connection of its own; on SQLite the transaction holds the database's
    write lock, so nobody can take the lease meanwhile and a read says whether it is still ours.
    """
    conn = connections[claim.using]
    sent = time.monotonic()
    if not conn.in_atomic_block:
        ledger.renew([claim.token], using=claim.using)
        claim.extend(sent)
        return ledger.holds_any(claim.token, using=claim.using)
    if conn.vendor == "sqlite":
        return ledger.holds_any(claim.token, using=claim.using)
    result: list[bool] = []

    def side() -> None:
        try:
            ledger.renew([claim.token], using=claim.using)
            claim.extend(sent)
            result.append(ledger.holds_any(claim.token, using=claim.using))
        finally:
            connections.close_all()

    thread = threading.Thread(target=side, name="tombstones-heartbeat", daemon=True)
    thread.start()
    thread.join(30)
    return bool(result and result[0])
