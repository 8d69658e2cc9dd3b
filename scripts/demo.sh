#!/usr/bin/env bash
# The demo: migrate the SQLite database, seed it, run the django-q2 cluster and the dev server.
# Ctrl-C, SIGTERM, SIGHUP, or the end of the pipe it writes to (`make demo | tee demo.log` with the
# tee gone) stops both, including qcluster's worker processes.
#
#   scripts/demo.sh           run the demo (make demo)
#   scripts/demo.sh --reset   delete the demo database and .mail/, migrate and seed again, exit
#                             (make demo-reset; refused while the demo runs, on any address)
#
# Environment: VENV (default .venv-demo), DEMO_ADDR (default 127.0.0.1:8000; exported, so the
# demo's CRM jobs post to this address), DEMO_ADMIN_PASSWORD / DEMO_AUDITOR_PASSWORD (generated
# and kept in .demo-credentials if unset).
set -euo pipefail

cd "$(dirname "$0")/.."
VENV=${VENV:-.venv-demo}
PY="$VENV/bin/python"
ADDR=${DEMO_ADDR:-127.0.0.1:8000}
case "$ADDR" in *:*) ;; *) ADDR="127.0.0.1:$ADDR" ;; esac  # a bare port, as runserver takes it
export DEMO_ADDR="$ADDR"
URL="http://$ADDR/admin/"
DEMO_DB="$(pwd)/db.sqlite3"
# "<pid> <address>" of the running demo: a reset refuses while it names a live demo, whatever
# DEMO_ADDR the reset was given.
PIDFILE="$(pwd)/.demo.pid"

if [ ! -x "$PY" ]; then
    echo "error: $PY not found: run 'make demo' (it creates the venv)" >&2
    exit 1
fi

running_demo() {
    # Prints "<pid> <address>" when the pid file names a demo that still runs (not a stale file,
    # nor a pid reused by another program).
    local pid addr
    [ -f "$PIDFILE" ] || return 1
    read -r pid addr < "$PIDFILE" || return 1
    [ -n "$pid" ] && kill -0 "$pid" 2>/dev/null || return 1
    ps -p "$pid" -o args= 2>/dev/null | grep -q "scripts/demo.sh" || return 1
    echo "$pid $addr"
}
if demo=$(running_demo); then
    if [ "${1:-}" = "--reset" ]; then
        echo "error: the demo runs (pid ${demo% *}, on ${demo#* }): stop the demo (Ctrl-C) before resetting it" >&2
    else
        echo "error: the demo already runs (pid ${demo% *}, on ${demo#* }): one demo per checkout" >&2
    fi
    exit 1
fi
if "$PY" - "$ADDR" <<'EOF'
import socket, sys
host, port = sys.argv[1].rsplit(":", 1)
with socket.socket() as s:
    s.settimeout(0.5)
    sys.exit(0 if s.connect_ex((host, int(port))) == 0 else 1)
EOF
then
    if [ "${1:-}" = "--reset" ]; then
        echo "error: something listens on $ADDR: stop the demo (Ctrl-C) before resetting it" >&2
    else
        echo "error: something already listens on $ADDR (set DEMO_ADDR=host:port)" >&2
    fi
    exit 1
fi

if [ "${1:-}" = "--reset" ]; then
    # Only the demo's own SQLite file: never a database that DATABASE_URL (or .env) points to.
    db=$("$PY" -c 'import os, django
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "project.settings")
django.setup()
from django.conf import settings
print(settings.DATABASES["default"]["NAME"])')
    if [ "$db" != "$DEMO_DB" ]; then
        echo "error: the default database is $db, not the demo's $DEMO_DB: not resetting it" >&2
        exit 1
    fi
    rm -f "$DEMO_DB" "$DEMO_DB-wal" "$DEMO_DB-shm" "$DEMO_DB-journal"
    rm -rf .mail
    "$PY" manage.py migrate --noinput -v 0
    "$PY" manage.py seed_demo
    echo "demo reset: a new db.sqlite3 with the seed data, and no .mail/. Run 'make demo'."
    exit 0
fi

echo "$$ $ADDR" > "$PIDFILE"
trap 'rm -f "$PIDFILE"' EXIT
"$PY" manage.py migrate --noinput
CREDENTIALS=$("$PY" manage.py seed_demo)
# The users and passwords are shown once, in the banner below.
echo "$CREDENTIALS" | grep -vE '^(demo users:|  (admin|auditor) )' || true

# Job control: each child runs in its own process group, so one kill reaches a child and
# everything it forked (qcluster's sentinel, workers, pusher, monitor), and Ctrl-C reaches
# only this script, which then stops them in order.
set -m
pids=()

# A message must never stop the stop: with `make demo | tee`, Ctrl-C ends the tee as well, and a
# write to its pipe would kill this script (SIGPIPE) before the children it started.
say() { echo "$@" 2>/dev/null || true; }

stop() {
    trap - INT TERM HUP EXIT
    trap '' PIPE
    set +m  # no "[2] Terminated" job notices: the children are stopped on purpose
    say
    say "stopping the dev server and the cluster..."
    local pid
    # The leaders first: qcluster stops its own workers gracefully on SIGTERM (signalling the
    # whole group at once would kill workers under its sentinel). Then insist on the groups.
    for pid in "${pids[@]}"; do
        kill -TERM "$pid" 2>/dev/null || true
    done
    local alive=1
    for _ in $(seq 1 75); do
        alive=0
        for pid in "${pids[@]}"; do
            if kill -0 -- "-$pid" 2>/dev/null; then alive=1; fi
        done
        [ "$alive" -eq 0 ] && break
        sleep 0.2
    done
    if [ "$alive" -eq 1 ]; then
        say "still running after 15s: killing them" >&2
        for pid in "${pids[@]}"; do
            kill -KILL -- "-$pid" 2>/dev/null || true
        done
    fi
    wait 2>/dev/null || true
    rm -f "$PIDFILE"
    say "stopped."
}
trap 'stop; exit 130' INT
trap 'stop; exit 143' TERM
trap 'stop; exit 129' HUP
trap 'stop; exit 141' PIPE
trap 'stop' EXIT

"$PY" manage.py qcluster &
pids+=($!)
"$PY" manage.py runserver --noreload "$ADDR" &
pids+=($!)

# When stdout is a pipe, a watcher that exits when its reader has gone (poll() reports POLLERR on
# a pipe's write end without readers): a demo whose tee died stops rather than run unseen.
if [ -p /dev/stdout ]; then
    "$PY" -c 'import select; p = select.poll(); p.register(1, select.POLLERR); p.poll()' &
    pids+=($!)
fi

for _ in $(seq 1 100); do
    if "$PY" -c "import sys, urllib.request; urllib.request.urlopen(sys.argv[1], timeout=1)" \
        "${URL}login/" 2>/dev/null; then
        break
    fi
    sleep 0.2
done

cat <<EOF

==============================================================================
  Tombstone guard demo: $URL
$(echo "$CREDENTIALS" | grep -E '^  (admin|auditor) ' || true)

  Queue a job:  $PY manage.py shell
                >>> import tombstones
                >>> from project.customers.models import Customer
                >>> tombstones.enqueue("customers.update_sheet_row", Customer.objects.first())
  Ctrl-C stops the server and the cluster.
==============================================================================

EOF

# Exits when any child exits, or the pipe's reader has gone (then the EXIT trap stops the rest).
wait -n "${pids[@]}" || true
say "a demo process exited, or its output's reader did; shutting down." >&2
