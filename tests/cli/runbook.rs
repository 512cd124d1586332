//! The runbook's plain SQL, for an operator without the tool, on a database the tool made.

use leasehold::now_ms;

use crate::helper::{add, cli, inspect, json, run_until_idle};
use crate::util::{TestDb, bare};

/// The runbook's fallback query, with leasehold's table name and without the columns
/// leasehold does not have.
const RUNBOOK_FALLBACK_SELECT: &str = "
SELECT
  id,
  status,
  recovery_count,
  started_at,
  completed_at,
  last_error
FROM jobs
WHERE status = 'failed'
  AND recovery_count > 3
  AND (
    lower(coalesce(last_error, '')) LIKE 'lease expired after missing heartbeat;%'
    OR lower(coalesce(last_error, '')) LIKE 'lease metadata missing for running job;%'
  )
ORDER BY completed_at DESC NULLS LAST, created_at DESC;
";

/// The runbook's manual requeue, with leasehold's table name and times.
const RUNBOOK_MANUAL_REQUEUE: &str = "
UPDATE jobs
SET
  status = 'pending',
  scheduled_at = ?2,
  started_at = NULL,
  completed_at = NULL,
  heartbeat_at = NULL,
  lease_expires_at = NULL,
  run_token = NULL,
  worker_id = NULL,
  recovery_count = 0,
  last_error = 'manual retry after lease recovery'
WHERE id = ?1;
";

#[test]
fn the_runbooks_plain_sql_works_on_a_database_the_cli_made() {
    let t = TestDb::new();
    let db = t.path.as_path();
    let id = add(db, &[], &["sh", "-c", "echo recovered"]);
    let by_sql_clock = add(db, &[], &["true"]);
    let bystander = add(db, &[], &["true"]);
    let conn = bare(db);
    for job in [id, by_sql_clock] {
        conn.execute(
            "UPDATE jobs SET status='failed', recovery_count=4, \
             last_error='lease expired after missing heartbeat; test' WHERE id=?",
            [job],
        )
        .unwrap();
    }

    let mut stmt = conn.prepare(RUNBOOK_FALLBACK_SELECT).unwrap();
    let found: Vec<(i64, String, i64)> = stmt
        .query_map([], |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?)))
        .unwrap()
        .collect::<Result<_, _>>()
        .unwrap();
    drop(stmt);
    let mut found_ids: Vec<i64> = found.iter().map(|f| f.0).collect();
    found_ids.sort_unstable();
    assert_eq!(found_ids, vec![id, by_sql_clock]);
    assert!(
        found.iter().all(|f| f.1 == "failed" && f.2 == 4),
        "{found:?}"
    );
    // The tool agrees with the plain SQL.
    let listed = json(&mut cli(db, &["jobs", "ls", "--failed-stale", "--json"]));
    assert_eq!(listed.as_array().unwrap().len(), 2);

    let changed = conn
        .execute(RUNBOOK_MANUAL_REQUEUE, rusqlite::params![id, now_ms()])
        .unwrap();
    assert_eq!(changed, 1);
    // The README's form, with the current time computed by SQLite itself.
    let sql_clock = RUNBOOK_MANUAL_REQUEUE.replace(
        "?2",
        "CAST((julianday('now') - 2440587.5) * 86400000 AS BIGINT)",
    );
    let before = now_ms();
    assert_eq!(conn.execute(&sql_clock, [by_sql_clock]).unwrap(), 1);
    let scheduled = inspect(db, by_sql_clock)["scheduled_at"].as_i64().unwrap();
    assert!(
        (scheduled - before).abs() < 5_000,
        "{scheduled} vs {before}"
    );
    drop(conn);

    run_until_idle(db, &[]);
    let job = inspect(db, id);
    assert_eq!(job["status"], "succeeded", "{job}");
    assert_eq!(job["output"]["stdout"], "recovered\n");
    assert_eq!(inspect(db, by_sql_clock)["status"], "succeeded");
    assert_eq!(inspect(db, bystander)["status"], "succeeded");
}
