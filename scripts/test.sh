#!/usr/bin/env bash
# The test suite in two parts (make test):
#
#   1. every test not marked `serial`, on TEST_WORKERS processes (pytest-xdist): each process
#      has a test database of its own, and every cluster a test starts has a queue of its own;
#   2. the tests marked `serial`, one at a time with nothing beside them (one restarts the
#      shared PostgreSQL server, which would cut every other process's connections).
#
#   scripts/test.sh PYTHON [pytest arguments...]
#
# Environment: TEST_WORKERS (default 4: most tests wait on worker processes and the database,
# so 4 keep 2 cores busy; 0 runs part 1 in this process), TEST_MARKS (a marker expression
# that narrows both parts, e.g. "not browser").
#
# A green run must have run tests: pytest's exit 5 ("no tests collected") from both parts fails
# the run; from one part it only means the selection holds none of that part's tests. Both parts
# run whatever the first one gave, so one run reports every failure.
set -uo pipefail

PY=$1
shift
WORKERS=${TEST_WORKERS:-4}
MARKS=${TEST_MARKS:-}

marks() {
    if [ -n "$MARKS" ]; then echo "($1) and ($MARKS)"; else echo "$1"; fi
}

echo "== tests: parallel part ($WORKERS processes)"
"$PY" -m pytest -n "$WORKERS" --dist worksteal -m "$(marks "not serial")" "$@"
first=$?

echo "== tests: serial part"
"$PY" -m pytest -m "$(marks "serial")" "$@"
second=$?

if [ "$first" -eq 5 ] && [ "$second" -eq 5 ]; then
    echo "error: pytest collected no tests (exit 5)" >&2
    exit 1
fi
[ "$first" -eq 5 ] && first=0
[ "$second" -eq 5 ] && second=0

[ "$first" -ne 0 ] && exit "$first"
exit "$second"
