#!/bin/sh
# job_counts stays exact under concurrency: 8 pgbench clients run runner-like transactions
# (runner_claim_first.sql, runner_end_first.sql) at once for $SECONDS_TO_RUN seconds on a new
# database made from src/store/pg/schema.sql, then the view job_counts is compared with a
# count of the table. pgbench's failures (deadlocks, serialization) are reported.
#
#   PGHOST=/tmp/sock PGPORT=54400 PGUSER=postgres tests/pg/counts_concurrent.sh [variant]
#
# variant: txn (the schema as written: a shard per transaction), or, to compare, id (the shard
# is the job's id % 16), one (a single row per queue and status, as on SQLite) or none (no
# count triggers: the cost of the rest; its counts are not compared).
set -eu
here=$(dirname "$0")
schema="$here/../../src/store/pg/schema.sql"
variant=${1:-txn}
db=leasehold_counts_$variant
seconds=${SECONDS_TO_RUN:-20}
psql="psql -X -q -v ON_ERROR_STOP=1"

$psql -d postgres -c "DROP DATABASE IF EXISTS $db" -c "CREATE DATABASE $db"
$psql -d "$db" -1 -f "$schema"
case $variant in
txn) ;;
none) $psql -d "$db" -c 'DROP TRIGGER job_counts_insert ON jobs' \
          -c 'DROP TRIGGER job_counts_update ON jobs' -c 'DROP TRIGGER job_counts_delete ON jobs' ;;
id | one)
    # The same function with the shard taken from the job (id) or fixed (one).
    if [ "$variant" = id ]; then old='OLD.id % 16'; new='NEW.id % 16'; else old=0; new=0; fi
    $psql -d "$db" <<SQL
CREATE OR REPLACE FUNCTION job_counts_follow() RETURNS trigger LANGUAGE plpgsql AS \$\$
BEGIN
    IF TG_OP = 'DELETE' OR TG_OP = 'UPDATE' THEN
        INSERT INTO job_count_shards AS c (queue, status, shard, n)
            VALUES (OLD.queue, OLD.status, $old, -1)
            ON CONFLICT (queue, status, shard) DO UPDATE SET n = c.n - 1;
    END IF;
    IF TG_OP = 'INSERT' OR TG_OP = 'UPDATE' THEN
        INSERT INTO job_count_shards AS c (queue, status, shard, n)
            VALUES (NEW.queue, NEW.status, $new, 1)
            ON CONFLICT (queue, status, shard) DO UPDATE SET n = c.n + 1;
    END IF;
    RETURN NULL;
END
\$\$;
SQL
    ;;
*) echo "unknown variant $variant" >&2; exit 2 ;;
esac
$psql -d "$db" -c "INSERT INTO jobs (queue, argv, created_at, scheduled_at)
    SELECT 'q' || (1 + i % 4), '[\"true\"]', 0, 0 FROM generate_series(1, 2000) AS i"

pgbench -n -c 8 -j 2 -T "$seconds" --max-tries=1 --failures-detailed \
    -f "$here/runner_claim_first.sql@1" -f "$here/runner_end_first.sql@1" "$db" 2>&1 |
    grep -E 'transactions actually processed|failed transactions|deadlock failures|serialization failures|^tps|aborted|error' || true

[ "$variant" = none ] || $psql -d "$db" -At <<'SQL'
SELECT 'jobs now: ' || count(*) || ', shards written: ' || (SELECT count(DISTINCT shard) FROM job_count_shards)
FROM jobs;
SELECT CASE WHEN count(*) = 0 THEN 'counts exact' ELSE count(*) || ' rows differ' END FROM (
    (SELECT queue, status, n FROM job_counts WHERE n <> 0
     EXCEPT ALL SELECT queue, status, count(*) FROM jobs GROUP BY 1, 2)
    UNION ALL
    (SELECT queue, status, count(*) FROM jobs GROUP BY 1, 2
     EXCEPT ALL SELECT queue, status, n FROM job_counts WHERE n <> 0)) AS d;
SQL
$psql -d postgres -c "DROP DATABASE $db"
