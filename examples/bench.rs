//! leasehold's figures, each beside the same work done in bare rusqlite.
//!
//! "Bare" is a plain rusqlite connection on a file with the same schema (`schema.sql`: the same
//! table, the same indexes) doing the equivalent raw SQL, without leasehold's events, fences,
//! validation or JSON. The ratio is leasehold's time per operation over bare rusqlite's.
//!
//! ```text
//! cargo run --release --example bench          # everything
//! cargo run --release --example bench store    # the store only
//! cargo run --release --example bench runner   # the runner only
//! cargo run --release --example bench retention # pruning's cost and the bounded file
//! cargo build --release && cargo run --release --example bench serve
//!                                              # the dashboard's pages at 1,000,000 jobs
//! cargo run --release --example bench metrics  # a scrape of a 1,000,000-job file, and
//!                                               # what the metrics cost writes
//! cargo run --release --example bench metrics-writes  # only the latter
//! cargo run --release --example bench flow     # claims beside waiting jobs, paused queues
//! cargo build --release && cargo run --release --example bench wake
//!                                              # wake-up, start/stop, idle CPU, CLI feeding
//! LEASEHOLD_BENCH_PG=postgres://... cargo run --release --example bench postgres
//!                                              # PostgreSQL beside SQLite and pgbench
//! ```

use std::time::{Duration, Instant};

use leasehold::protocol::{ClaimRequest, Ending, Finish, Finished};
use leasehold::{Durability, Job, OpenOptions, PruneOptions, Retention, Store, now_ms};
use rusqlite::{Connection, params};
use tempfile::TempDir;

// The PostgreSQL section, in a file of its own (a crate root finds its modules beside it, so
// the path is given; a file in a folder of examples/ is not an example of its own).
#[path = "bench/postgres.rs"]
mod postgres;

const SCHEMA: &str = include_str!("../schema.sql");
const TTL: Duration = Duration::from_secs(30);
const DAY_MS: i64 = 86_400_000;

/// The sections by name, in the order a run without arguments takes them; `false` when a
/// section runs only when named.
const SECTIONS: &[(&str, bool, fn())] = &[
    ("store", true, store_benchmarks),
    ("runner", true, runner_benchmarks),
    ("retention", true, retention_benchmarks),
    ("serve", true, serve_benchmarks),
    ("metrics", true, metrics_benchmarks),
    ("metrics-writes", false, metrics_writes_only),
    ("flow", true, flow_benchmarks),
    ("wake", true, wake_benchmarks),
    ("postgres", false, postgres::postgres_benchmarks),
];

fn main() {
    let args: Vec<String> = std::env::args().collect();
    if postgres::child(&args) {
        return;
    }
    let only = args.get(1).cloned();
    if let Some(arg) = only.as_deref()
        && !SECTIONS.iter().any(|(name, _, _)| *name == arg)
    {
        let names: Vec<&str> = SECTIONS.iter().map(|(name, _, _)| *name).collect();
        eprintln!("usage: bench [{}]", names.join("|"));
        std::process::exit(2);
    }
    let started = Instant::now();
    for (name, in_all, run) in SECTIONS {
        if only.as_deref() == Some(*name) || (only.is_none() && *in_all) {
            run();
        }
    }
    println!("\ntotal {:.1} s", started.elapsed().as_secs_f64());
}

// ---------------------------------------------------------------------------------------------
// The store

fn store_benchmarks() {
    let dir = tempfile::tempdir().expect("a temporary folder can be created");
    let mut table = Table::new("store");

    batch_enqueue(&dir, &mut table);
    single_enqueue(&dir, &mut table, Durability::Full, 300);
    single_enqueue(&dir, &mut table, Durability::Normal, 300);
    claim_rates(&dir, &mut table);
    renewal(&dir, &mut table);
    for (durability, cycles) in [(Durability::Full, 300), (Durability::Normal, 3000)] {
        claim_finish_cycles(&dir, &mut table, durability, cycles);
    }
    table.note("ratio = leasehold's time per operation / bare rusqlite's; NORMAL and FULL are");
    table.note("synchronous in WAL mode. Claims are timed under NORMAL so that the query, not");
    table.note("the disk's flush, is what the table sizes are compared on.");
}

fn open(path: &std::path::Path, durability: Durability) -> Store {
    let options = OpenOptions::new().durability(durability);
    Store::open_with(path, &options).expect("the bench database opens")
}

fn sync_name(durability: Durability) -> &'static str {
    match durability {
        Durability::Full => "FULL",
        Durability::Normal => "NORMAL",
    }
}

/// A bare connection on a new file with leasehold's schema, in WAL mode and
/// `auto_vacuum = INCREMENTAL` as leasehold creates its files (the mode must be chosen before
/// the journal mode and the first table).
fn bare_new(path: &std::path::Path, durability: Durability) -> Connection {
    Connection::open(path)
        .and_then(|c| c.execute_batch("PRAGMA auto_vacuum = INCREMENTAL"))
        .expect("the auto_vacuum mode is set");
    let conn = bare_open(path, durability);
    conn.execute_batch(SCHEMA).expect("schema.sql runs");
    conn
}

fn bare_open(path: &std::path::Path, durability: Durability) -> Connection {
    let conn = Connection::open(path).expect("a bare connection opens");
    conn.busy_timeout(Duration::from_secs(10)).unwrap();
    conn.query_row("PRAGMA journal_mode = WAL", [], |r| r.get::<_, String>(0))
        .unwrap();
    conn.pragma_update(None, "synchronous", sync_name(durability))
        .unwrap();
    conn
}

/// The same row leasehold writes for `Job::command(["true"])`.
const BARE_INSERT: &str = "INSERT INTO jobs (queue, argv, env, cwd, priority, status,
        max_attempts, backoff_base_ms, backoff_max_ms, on_lost, timeout_ms, idle_timeout_ms,
        created_at, scheduled_at)
    VALUES ('default', '[\"true\"]', '[]', NULL, 0, 'pending', 1, 1000, 3600000, 'requeue',
        NULL, NULL, ?1, ?2)";

/// leasehold's claim of one job, without the event, the JSON and the returned command (and,
/// like leasehold's, naming its index: left to itself, the planner sorts every pending row).
const BARE_CLAIM: &str = "UPDATE jobs SET status = 'running', attempt = attempt + 1,
        run_token = lower(hex(randomblob(16))), worker_id = ?1, started_at = ?2,
        heartbeat_at = ?2, lease_expires_at = ?3
    WHERE id IN (SELECT id FROM jobs INDEXED BY jobs_claim
                 WHERE status = 'pending' AND teardown_token IS NULL AND waiting = 0
                 AND scheduled_at <= ?2
                 ORDER BY priority DESC, scheduled_at, id LIMIT 1)
    RETURNING id, run_token";

fn bare_claim(conn: &Connection, now: i64) -> Option<(i64, String)> {
    conn.execute_batch("BEGIN IMMEDIATE").unwrap();
    let claimed = conn
        .prepare_cached(BARE_CLAIM)
        .unwrap()
        .query_row(params!["bare", now, now + 30_000], |r| {
            Ok((r.get(0)?, r.get(1)?))
        })
        .ok();
    conn.execute_batch("COMMIT").unwrap();
    claimed
}

fn claim_one(store: &Store, now: i64) -> Option<leasehold::protocol::Claimed> {
    let req = ClaimRequest {
        worker_id: "bench",
        limit: 1,
        queues: &[],
        lease_ttl: TTL,
        queue_caps: &[],
        unheld: 0,
    };
    store.claim(&req, now).expect("claim").pop()
}

/// Median of three rounds each, after a first round that is reported apart: the first large
/// transaction of a fresh process runs while glibc's heap still grows and shrinks page by page.
fn batch_enqueue(dir: &TempDir, table: &mut Table) {
    const N: usize = 100_000;
    const ROUNDS: usize = 3;
    let jobs = vec![Job::command(["true"]); N];
    let ours = |name: String| {
        let store = open(&dir.path().join(name), Durability::Full);
        let now = now_ms();
        let t = Instant::now();
        store.enqueue_many_at(&jobs, now).expect("enqueue_many");
        t.elapsed()
    };
    let bare = |name: String| {
        let conn = bare_new(&dir.path().join(name), Durability::Full);
        let now = now_ms();
        let t = Instant::now();
        let tx = conn.unchecked_transaction().unwrap();
        {
            let mut insert = tx.prepare_cached(BARE_INSERT).unwrap();
            for _ in 0..N {
                insert.execute([now, now]).unwrap();
            }
        }
        tx.commit().unwrap();
        t.elapsed()
    };
    let cold = ours("batch-cold.db".into());
    let (mut mine, mut theirs) = (Vec::new(), Vec::new());
    for i in 0..ROUNDS {
        mine.push(ours(format!("batch-{i}.db")));
        theirs.push(bare(format!("batch-{i}-bare.db")));
    }
    let label = "batch enqueue, 100,000 jobs in 1 txn";
    table.rate(label, N, median(mine), Some(median(theirs)), "jobs/s");
    table.note(&format!(
        "  (median of {ROUNDS}; the process's first batch: {} jobs/s)",
        thousands(N as f64 / cold.as_secs_f64())
    ));
}

fn single_enqueue(dir: &TempDir, table: &mut Table, durability: Durability, n: usize) {
    let name = sync_name(durability);
    let store = open(&dir.path().join(format!("single-{name}.db")), durability);
    let job = Job::command(["true"]);
    let t = Instant::now();
    for _ in 0..n {
        store.enqueue(&job).expect("enqueue");
    }
    let ours = t.elapsed();

    let conn = bare_new(
        &dir.path().join(format!("single-{name}-bare.db")),
        durability,
    );
    let t = Instant::now();
    for _ in 0..n {
        conn.execute_batch("BEGIN IMMEDIATE").unwrap();
        let now = now_ms();
        conn.prepare_cached(BARE_INSERT)
            .unwrap()
            .execute([now, now])
            .unwrap();
        conn.execute_batch("COMMIT").unwrap();
    }
    let bare = t.elapsed();
    let label = format!("enqueue 1 job per txn ({n}), {name}");
    table.rate(&label, n, ours, Some(bare), "jobs/s");
}

/// Claims one at a time from 1,000 pending jobs, from 1,000,000, and from 1,000,000 of which
/// half are due tomorrow: a claim reads the head of an index, so the three rates are close.
fn claim_rates(dir: &TempDir, table: &mut Table) {
    const ROUNDS: usize = 5;
    const CLAIMS: usize = 400;
    let small = vec![Job::command(["true"]); 1000];
    let chunk = vec![Job::command(["true"]); 100_000];
    let half_later: Vec<Job> = (0..100_000)
        .map(|i| {
            let job = Job::command(["true"]);
            if i % 2 == 1 {
                job.delay(Duration::from_millis(DAY_MS as u64))
            } else {
                job
            }
        })
        .collect();
    let cases: [(&str, &[Job], usize); 3] = [
        ("1,000 pending", &small, 1),
        ("1,000,000 pending", &chunk, 10),
        ("1,000,000 (half due tomorrow)", &half_later, 10),
    ];
    // Build the three files first, then time their rounds in turn, so that a noisy moment of
    // this shared machine falls on every size alike rather than on one.
    let mut built = Vec::new();
    for (i, (label, jobs, chunks)) in cases.into_iter().enumerate() {
        let path = dir.path().join(format!("claims-{i}.db"));
        let setup = Instant::now();
        let now = now_ms();
        {
            let store = open(&path, Durability::Normal);
            for _ in 0..chunks {
                store.enqueue_many_at(jobs, now).expect("enqueue_many");
            }
        }
        let store = open(&path, Durability::Normal);
        let bare = bare_open(&path, Durability::Normal);
        built.push((
            label,
            store,
            bare,
            now,
            setup.elapsed(),
            Vec::new(),
            Vec::new(),
        ));
    }
    for _ in 0..ROUNDS {
        for (_, store, bare, now, _, ours, theirs) in &mut built {
            let t = Instant::now();
            for _ in 0..CLAIMS {
                claim_one(store, *now).expect("a job is ready");
            }
            ours.push(t.elapsed());
            requeue_running(bare);
            let t = Instant::now();
            for _ in 0..CLAIMS {
                bare_claim(bare, *now).expect("a job is ready");
            }
            theirs.push(t.elapsed());
            requeue_running(bare);
        }
    }
    let mut rates = Vec::new();
    for (label, _, _, _, setup, ours, theirs) in built {
        let (ours, theirs) = (median(ours), median(theirs));
        rates.push(CLAIMS as f64 / ours.as_secs_f64());
        let label = format!("claim 1 job, {label}, NORMAL");
        table.rate(&label, CLAIMS, ours, Some(theirs), "claims/s");
        table.note(&format!(
            "  (built in {:.1} s; median of {ROUNDS} rounds of {CLAIMS} claims, rounds of the",
            setup.as_secs_f64()
        ));
        table.note("   three sizes taken in turn)");
    }
    let max = rates.iter().copied().fold(f64::MIN, f64::max);
    let min = rates.iter().copied().fold(f64::MAX, f64::min);
    let verdict = if max / min <= 1.5 {
        "within 1.5x"
    } else {
        "NOT within 1.5x"
    };
    table.note(&format!(
        "claim rates max/min = {:.2} ({verdict})",
        max / min
    ));
}

/// Puts the claimed jobs back, so that every round claims from the same table.
fn requeue_running(conn: &Connection) {
    conn.execute(
        "UPDATE jobs SET status = 'pending', attempt = 0, run_token = NULL, worker_id = NULL,
             started_at = NULL, heartbeat_at = NULL, lease_expires_at = NULL
         WHERE status = 'running'",
        [],
    )
    .unwrap();
}

fn median(mut times: Vec<Duration>) -> Duration {
    times.sort();
    times[times.len() / 2]
}

/// One renewal of the 1,000 leases a runner holds.
fn renewal(dir: &TempDir, table: &mut Table) {
    const LEASES: usize = 1000;
    const CALLS: usize = 20;
    let path = dir.path().join("renew.db");
    let now = now_ms();
    let tokens: Vec<String> = {
        let store = open(&path, Durability::Normal);
        store
            .enqueue_many_at(&vec![Job::command(["true"]); LEASES], now)
            .unwrap();
        let req = ClaimRequest {
            worker_id: "bench",
            limit: LEASES as u32,
            queues: &[],
            lease_ttl: TTL,
            queue_caps: &[],
            unheld: 0,
        };
        store
            .claim(&req, now)
            .unwrap()
            .into_iter()
            .map(|c| c.run_token)
            .collect()
    };
    for durability in [Durability::Full, Durability::Normal] {
        let store = open(&path, durability);
        let t = Instant::now();
        for i in 0..CALLS {
            let renewal = store.renew("bench", &tokens, TTL, now + i as i64).unwrap();
            assert_eq!(renewal.renewed.len(), LEASES);
        }
        let ours = t.elapsed();

        let conn = bare_open(&path, durability);
        let t = Instant::now();
        for i in 0..CALLS {
            conn.execute_batch("BEGIN IMMEDIATE").unwrap();
            let now = now + i as i64;
            let renewed = conn
                .prepare_cached(
                    "UPDATE jobs SET heartbeat_at = ?2, lease_expires_at = ?3
                     WHERE status = 'running' AND worker_id = ?1",
                )
                .unwrap()
                .execute(params!["bench", now, now + 30_000])
                .unwrap();
            conn.execute_batch("COMMIT").unwrap();
            assert_eq!(renewed, LEASES);
        }
        let bare = t.elapsed();
        let label = format!("renew 1,000 leases in 1 call, {}", sync_name(durability));
        table.per_call(&label, CALLS, ours, bare);
    }
}

/// The queue's own ceiling: claim one job, record its success, repeat; no process at all.
fn claim_finish_cycles(dir: &TempDir, table: &mut Table, durability: Durability, n: usize) {
    let name = sync_name(durability);
    let path = dir.path().join(format!("cycles-{name}.db"));
    let now = now_ms();
    let store = open(&path, durability);
    store
        .enqueue_many_at(&vec![Job::command(["true"]); n], now)
        .unwrap();
    let t = Instant::now();
    for _ in 0..n {
        let c = claim_one(&store, now).expect("a job is ready");
        let finish = Finish {
            job_id: c.id,
            run_token: c.run_token,
            attempt: c.attempt,
            ending: Ending::Succeeded,
            output: None,
            notes: Vec::new(),
            max_recovery_attempts: 3,
        };
        let done = store.finish(&finish, now).unwrap();
        assert!(matches!(done, Finished::Recorded(_)));
    }
    let ours = t.elapsed();

    let bare_path = dir.path().join(format!("cycles-{name}-bare.db"));
    let conn = bare_new(&bare_path, durability);
    let tx = conn.unchecked_transaction().unwrap();
    for _ in 0..n {
        tx.prepare_cached(BARE_INSERT)
            .unwrap()
            .execute([now, now])
            .unwrap();
    }
    tx.commit().unwrap();
    let t = Instant::now();
    for _ in 0..n {
        let (id, _) = bare_claim(&conn, now).expect("a job is ready");
        conn.execute_batch("BEGIN IMMEDIATE").unwrap();
        conn.prepare_cached(
            "UPDATE jobs SET status = 'succeeded', completed_at = ?2, exit_code = 0,
                 lease_expires_at = NULL WHERE id = ?1",
        )
        .unwrap()
        .execute([id, now])
        .unwrap();
        conn.execute_batch("COMMIT").unwrap();
    }
    let bare = t.elapsed();
    let label = format!("claim + finish, no process ({n}), {name}");
    table.rate(&label, n, ours, Some(bare), "cycles/s");
}

// ---------------------------------------------------------------------------------------------
// The runner

const JOBS: usize = 2000;
const WORKERS: usize = 4;

/// Rounds of the runner benchmark; its figures are the medians.
const ROUNDS: usize = 5;

/// Where a runner's database (and so its attempts' folder) lives.
#[derive(Clone, Copy)]
enum Disk {
    /// A temporary folder on this machine's disk (`/tmp`), as every runner row used.
    Disk,
    /// `/dev/shm`: tmpfs, where an fsync costs nothing, so the keeper's processes are what is
    /// left of its cost.
    Tmpfs,
}

/// One run of a round of the runner benchmark: the bare loop, or a runner with this
/// durability, keepers on or off, on this disk.
type RunnerRun = (&'static str, Option<(Durability, bool, Disk)>);

/// The runs of each round of the runner benchmark: the bare loop, then each durability with
/// keepers on (the default since issue 20) and off (as every runner row measured before it),
/// then FULL both ways on tmpfs.
const RUNNER_RUNS: [RunnerRun; 7] = [
    ("bare", None),
    (
        "FULL, keepers on (default)",
        Some((Durability::Full, true, Disk::Disk)),
    ),
    (
        "FULL, keepers off",
        Some((Durability::Full, false, Disk::Disk)),
    ),
    (
        "NORMAL, keepers on",
        Some((Durability::Normal, true, Disk::Disk)),
    ),
    (
        "NORMAL, keepers off",
        Some((Durability::Normal, false, Disk::Disk)),
    ),
    (
        "FULL, keepers on, tmpfs",
        Some((Durability::Full, true, Disk::Tmpfs)),
    ),
    (
        "FULL, keepers off, tmpfs",
        Some((Durability::Full, false, Disk::Tmpfs)),
    ),
];

/// 2,000 jobs of `/bin/true` on 4 workers, beside a bare loop of `Command::output()` (spawn,
/// capture both streams, wait) on 4 threads, with keepers (each attempt's command a child of
/// its keeper, its output in files and its outcome written durably) and without. This machine
/// is shared and noisy: one run of each swung the ratio from 0.71 to 0.88. So each round runs
/// the bare loop and all six runner modes back to back (in a rotating order, so that none is
/// always first), the ratios are taken within the round, and the table shows the medians of
/// the rounds. Then the keeper's memory, from a keeper of a running `sleep`.
fn runner_benchmarks() {
    println!();
    heading(
        "runner: 2,000 × /bin/true, 4 workers",
        "jobs/s",
        "bare jobs/s",
    );
    // Per round: jobs/s of each of RUNNER_RUNS, in its order.
    let mut rounds: Vec<[f64; RUNNER_RUNS.len()]> = Vec::with_capacity(ROUNDS);
    let n = RUNNER_RUNS.len();
    for round in 0..ROUNDS {
        let mut rates = [0.0; RUNNER_RUNS.len()];
        for k in 0..n {
            let which = (round + k) % n;
            rates[which] = match RUNNER_RUNS[which].1 {
                None => bare_spawn_rate(),
                Some((durability, keepers, disk)) => runner_rate(durability, keepers, disk),
            };
        }
        rounds.push(rates);
    }
    let mid = |mut v: Vec<f64>| {
        v.sort_by(f64::total_cmp);
        v[v.len() / 2]
    };
    let listed = |ratios: &[f64]| {
        let each: Vec<String> = ratios.iter().map(|r| format!("{r:.2}")).collect();
        each.join(", ")
    };
    let bare = mid(rounds.iter().map(|r| r[0]).collect());
    println!(
        "{:<50} {:>18} {:>18} {:>7}",
        "bare Command::output() loop, 4 threads",
        thousands(bare),
        thousands(bare),
        "1.00"
    );
    for (i, (name, _)) in RUNNER_RUNS.iter().enumerate().skip(1) {
        let ratios: Vec<f64> = rounds.iter().map(|r| r[i] / r[0]).collect();
        println!(
            "{:<50} {:>18} {:>18} {:>7.2}",
            format!("leasehold runner, {name}"),
            thousands(mid(rounds.iter().map(|r| r[i]).collect())),
            thousands(bare),
            mid(ratios.clone())
        );
        println!("  (ratio in each round: {})", listed(&ratios));
    }
    println!(
        "{ROUNDS} rounds, each the bare loop and the six runner modes back to back; jobs/s are"
    );
    println!(
        "the medians of the rounds, ratio the median of each round's leasehold / bare (higher"
    );
    println!("is better; 1.00 = no overhead).");
    println!();
    println!(
        "{:<50} {:>18} {:>18}",
        "runner: keepers on / off", "ratio", "ms more a job"
    );
    println!("{}", "-".repeat(50 + 18 + 18 + 7 + 3));
    for (name, on, off) in [("FULL", 1, 2), ("NORMAL", 3, 4), ("FULL, tmpfs", 5, 6)] {
        let ratios: Vec<f64> = rounds.iter().map(|r| r[on] / r[off]).collect();
        // The worker time a keeper adds to a job: each of the workers spends 1 / rate × WORKERS
        // seconds a job.
        let extra: Vec<f64> = rounds
            .iter()
            .map(|r| (1.0 / r[on] - 1.0 / r[off]) * WORKERS as f64 * 1000.0)
            .collect();
        println!(
            "{:<50} {:>18.2} {:>18.2}",
            format!("keepers on / off, {name}"),
            mid(ratios.clone()),
            mid(extra)
        );
        println!("  (ratio in each round: {})", listed(&ratios));
    }
    println!("ratio = jobs/s with keepers / without, in the same round (median of the rounds);");
    println!(
        "ms more a job = the worker time a keeper adds to each job, (1/on - 1/off) × 4 workers."
    );
    println!();
    keeper_memory();
    println!();
    beside_xargs();
    println!();
    disk_after_jobs();
}

/// The default runner beside `xargs -P4`, which runs the same 2,000 `/bin/true` with 4 at a
/// time and stores nothing: three rounds alternated, medians.
fn beside_xargs() {
    // One argument a line: xargs runs `/bin/true ARG` once a line, 4 at a time.
    let list: String = "x\n".repeat(JOBS);
    let xargs = || {
        let t = Instant::now();
        let mut child = std::process::Command::new("xargs")
            .args(["-P4", "-n1", "/bin/true"])
            .stdin(std::process::Stdio::piped())
            .spawn()
            .expect("xargs runs");
        use std::io::Write as _;
        child
            .stdin
            .take()
            .expect("xargs's stdin")
            .write_all(list.as_bytes())
            .expect("the list is written");
        assert!(child.wait().expect("xargs ends").success());
        JOBS as f64 / t.elapsed().as_secs_f64()
    };
    let (mut ours, mut theirs) = (Vec::new(), Vec::new());
    for _ in 0..3 {
        theirs.push(xargs());
        ours.push(runner_rate(Durability::Full, true, Disk::Disk));
    }
    let mid = |mut v: Vec<f64>| {
        v.sort_by(f64::total_cmp);
        v[v.len() / 2]
    };
    let (ours, theirs) = (mid(ours), mid(theirs));
    println!(
        "{:<50} {:>18} {:>18} {:>7}",
        "runner, defaults, beside xargs -P4 -n1 /bin/true", "jobs/s", "xargs jobs/s", "ratio"
    );
    println!("{}", "-".repeat(50 + 18 + 18 + 7 + 3));
    println!(
        "{:<50} {:>18} {:>18} {:>7.2}",
        "2,000 × /bin/true, 4 at a time",
        thousands(ours),
        thousands(theirs),
        ours / theirs
    );
}

/// What 2,000 jobs leave beside the database with the defaults (keepers on): silent
/// `/bin/true`, then `echo` of one line. The folders' entries and bytes beside the database
/// file's bytes.
fn disk_after_jobs() {
    println!(
        "{:<50} {:>18} {:>18} {:>7}",
        "beside the database after 2,000 jobs", "entries, bytes", "database bytes", "ratio"
    );
    println!("{}", "-".repeat(50 + 18 + 18 + 7 + 3));
    for (label, job) in [
        ("silent (/bin/true)", Job::command(["/bin/true"])),
        (
            "one line (echo)",
            Job::command(["echo", "a line of output"]),
        ),
    ] {
        let dir = tempfile::tempdir().expect("a temporary folder can be created");
        let path = dir.path().join("disk.db");
        let (last, ended) = std::sync::mpsc::channel();
        let seen = std::sync::atomic::AtomicUsize::new(0);
        let runner = leasehold::Runner::builder(&path)
            .workers(WORKERS)
            .on_complete(move |_| {
                if seen.fetch_add(1, std::sync::atomic::Ordering::Relaxed) + 1 == JOBS {
                    let _ = last.send(());
                }
            })
            .start()
            .expect("the runner starts");
        runner
            .enqueue_many(&vec![job; JOBS])
            .expect("the jobs are enqueued");
        ended
            .recv_timeout(Duration::from_secs(600))
            .expect("every job ends");
        runner.shutdown().expect("the runner shuts down");
        let [wake, attempts] = leasehold::local_folders(&path);
        let (mut entries, mut bytes) = (0u64, 0u64);
        for folder in [attempts, wake] {
            for entry in walk(&folder) {
                entries += 1;
                bytes += entry;
            }
        }
        let db: u64 = ["", "-wal", "-shm"]
            .iter()
            .filter_map(|s| std::fs::metadata(format!("{}{s}", path.display())).ok())
            .map(|m| m.len())
            .sum();
        println!(
            "{:<50} {:>18} {:>18} {:>7.2}",
            label,
            format!("{entries}, {}", thousands(bytes as f64)),
            thousands(db as f64),
            bytes as f64 / db as f64
        );
    }
    println!(
        "entries: the folders and files under <db>-attempts and <db>-wake, themselves included;"
    );
    println!(
        "bytes: their sizes on disk (st_blocks × 512), beside the database's file, WAL and shm."
    );
}

/// The on-disk sizes (st_blocks × 512) of `folder` and of everything under it.
fn walk(folder: &std::path::Path) -> Vec<u64> {
    use std::os::unix::fs::MetadataExt as _;
    let Ok(meta) = std::fs::symlink_metadata(folder) else {
        return Vec::new();
    };
    let mut sizes = vec![meta.blocks() * 512];
    if meta.is_dir() {
        for entry in std::fs::read_dir(folder).into_iter().flatten().flatten() {
            sizes.extend(walk(&entry.path()));
        }
    }
    sizes
}

fn bare_spawn_rate() -> f64 {
    let t = Instant::now();
    let threads: Vec<_> = (0..WORKERS)
        .map(|_| {
            std::thread::spawn(|| {
                for _ in 0..JOBS / WORKERS {
                    let out = std::process::Command::new("/bin/true")
                        .output()
                        .expect("/bin/true runs");
                    assert!(out.status.success());
                }
            })
        })
        .collect();
    for t in threads {
        t.join().expect("a bare spawn thread does not panic");
    }
    JOBS as f64 / t.elapsed().as_secs_f64()
}

/// `JOBS` jobs of `/bin/true` through a runner of `WORKERS` workers with `durability`, each
/// attempt under a keeper when `keepers`, its database on `disk`; jobs/s from the enqueue to
/// the last ending.
fn runner_rate(durability: Durability, keepers: bool, disk: Disk) -> f64 {
    let dir = match disk {
        Disk::Disk => tempfile::tempdir(),
        Disk::Tmpfs => tempfile::tempdir_in("/dev/shm"),
    }
    .expect("a temporary folder can be created (on tmpfs: /dev/shm, as on every Linux)");
    let path = dir.path().join("runner.db");
    // The last ending is learnt as an application would, from the runner's completions, not
    // by polling the database: a poll every 5 ms from a third connection cost the runner's
    // side some 20 µs of CPU a job, which the bare loop's joins do not pay.
    let (last, ended) = std::sync::mpsc::channel();
    let seen = std::sync::atomic::AtomicUsize::new(0);
    let runner = leasehold::Runner::builder(&path)
        .workers(WORKERS)
        .durability(durability)
        .keepers(keepers)
        .on_complete(move |_| {
            if seen.fetch_add(1, std::sync::atomic::Ordering::Relaxed) + 1 == JOBS {
                let _ = last.send(());
            }
        })
        .start()
        .expect("the runner starts");
    let jobs = vec![Job::command(["/bin/true"]); JOBS];
    let t = Instant::now();
    runner.enqueue_many(&jobs).expect("the jobs are enqueued");
    ended
        .recv_timeout(Duration::from_secs(600))
        .expect("every job ends");
    let rate = JOBS as f64 / t.elapsed().as_secs_f64();
    let watch = Store::open(&path).expect("the bench database opens");
    let counts = watch.counts().expect("counts");
    assert_eq!(
        counts.succeeded, JOBS as u64,
        "every /bin/true job succeeds"
    );
    runner.shutdown().expect("the runner shuts down");
    rate
}

/// The memory of one keeper: a runner (keepers on, one worker) starts `sleep 30`, and once
/// the job's keeper is recorded, the keeper's VmRSS (`/proc/PID/status`) and its Rss and Pss
/// (`/proc/PID/smaps_rollup`), beside those of the `sleep` it keeps and of this process (the
/// application that links the runner). The keeper is spawned, never forked from the
/// application, so its memory is its own small static program's.
fn keeper_memory() {
    let dir = tempfile::tempdir().expect("a temporary folder can be created");
    let path = dir.path().join("keeper.db");
    let runner = leasehold::Runner::builder(&path)
        .workers(1)
        .start()
        .expect("the runner starts");
    let id = runner
        .enqueue(&Job::command(["sleep", "30"]))
        .expect("the job is enqueued");
    let watch = Store::open(&path).expect("the bench database opens");
    let deadline = Instant::now() + Duration::from_secs(10);
    let pids = loop {
        let job = watch.job(id).expect("the job reads");
        if let (Some(keeper), Some(command)) = (job.keeper_pid, job.pid) {
            break Some((keeper, command));
        }
        if Instant::now() > deadline {
            break None;
        }
        std::thread::sleep(Duration::from_millis(5));
    };
    println!(
        "{:<50} {:>12} {:>12} {:>12}",
        "memory of a keeper of a running `sleep 30`", "VmRSS", "Rss", "Pss"
    );
    println!("{}", "-".repeat(50 + 18 + 18 + 7 + 3));
    match pids {
        Some((keeper, command)) => {
            let this = i64::from(std::process::id());
            for (label, pid) in [
                ("the keeper", keeper),
                ("the `sleep` it keeps", command),
                ("this process (the application)", this),
            ] {
                let status = proc_kb(pid, "status", "VmRSS:");
                let rss = proc_kb(pid, "smaps_rollup", "Rss:");
                let pss = proc_kb(pid, "smaps_rollup", "Pss:");
                println!(
                    "{:<50} {:>12} {:>12} {:>12}",
                    label,
                    kb(status),
                    kb(rss),
                    kb(pss)
                );
            }
        }
        None => println!("(the job's keeper was not recorded within 10 s)"),
    }
    runner.cancel(id).expect("the job is cancelled");
    runner.shutdown().expect("the runner shuts down");
}

/// The kB of the line that starts with `key` in `/proc/PID/<file>`; `None` when the file or
/// the line cannot be read (no `/proc`, an older kernel without `smaps_rollup`).
fn proc_kb(pid: i64, file: &str, key: &str) -> Option<u64> {
    let text = std::fs::read_to_string(format!("/proc/{pid}/{file}")).ok()?;
    let line = text.lines().find(|l| l.starts_with(key))?;
    line[key.len()..].split_whitespace().next()?.parse().ok()
}

/// `Some(708)` as `708 kB`, `None` as `-`.
fn kb(v: Option<u64>) -> String {
    v.map_or_else(
        || "-".to_string(),
        |v| format!("{} kB", thousands(v as f64)),
    )
}

// ---------------------------------------------------------------------------------------------
// Retention

/// The time a sweeper's prune may take: half the default sweep interval (see the sweeper).
const ROUND_BUDGET: Duration = Duration::from_millis(2500);

fn retention_benchmarks() {
    println!();
    println!("retention");
    heading("", "with pruning", "baseline");
    println!("(the runners here run with keepers on, the default)");
    prune_cost();
    steady_state();
    claim_latency_during_prune();
}

/// A new file: schema version 2 creates it `auto_vacuum = INCREMENTAL`, with the index the
/// prune reads.
fn incremental_file(path: &std::path::Path) {
    drop(Store::open(path).expect("the bench database opens"));
}

/// Bytes of the main file and its WAL.
fn file_bytes(path: &std::path::Path) -> u64 {
    let len = |p: &std::path::Path| std::fs::metadata(p).map(|m| m.len()).unwrap_or(0);
    let mut wal = path.as_os_str().to_os_string();
    wal.push("-wal");
    len(path) + len(std::path::Path::new(&wal))
}

fn mib(bytes: u64) -> String {
    format!("{:.1} MiB", bytes as f64 / (1024.0 * 1024.0))
}

/// `n` jobs of `/bin/true` through a runner with `policy`, sweeping every `sweep`; jobs/s.
fn pruning_rate(policy: Retention, n: usize, sweep: Duration) -> f64 {
    let dir = tempfile::tempdir().expect("a temporary folder can be created");
    let path = dir.path().join("prune.db");
    incremental_file(&path);
    let runner = leasehold::Runner::builder(&path)
        .workers(WORKERS)
        .sweep_interval(sweep)
        .retention(policy)
        .start()
        .expect("the runner starts");
    let watch = Store::open(&path).expect("the bench database opens");
    let jobs = vec![Job::command(["/bin/true"]); n];
    let t = Instant::now();
    runner.enqueue_many(&jobs).expect("the jobs are enqueued");
    while watch.has_unfinished(&[]).expect("the bench database reads") {
        std::thread::sleep(Duration::from_millis(5));
    }
    let rate = n as f64 / t.elapsed().as_secs_f64();
    runner.shutdown().expect("the runner shuts down");
    rate
}

/// Throughput with and without pruning, alternated, medians.
fn prune_cost() {
    const N: usize = 4000;
    let sweep = Duration::from_millis(200);
    let (mut without, mut with) = (Vec::new(), Vec::new());
    for _ in 0..3 {
        without.push(pruning_rate(Retention::keep_all(), N, sweep));
        // Every finished job is due at the next sweep: the most pruning a runner can do.
        let prune_all = Retention::keep_all()
            .succeeded(Some(Duration::ZERO))
            .keep_max(Some(0));
        with.push(pruning_rate(prune_all, N, sweep));
    }
    let med = |mut v: Vec<f64>| {
        v.sort_by(f64::total_cmp);
        v[v.len() / 2]
    };
    let (w, wo) = (med(with), med(without));
    println!(
        "{:<50} {:>18} {:>18} {:>7.2}",
        "runner jobs/s, pruning every job (keep 0) / none",
        thousands(w),
        thousands(wo),
        w / wo
    );
    println!(
        "  {N} × /bin/true, {WORKERS} workers, sweep 0.2 s, FULL; median of 3 alternated runs"
    );
}

/// The file's size while jobs flow through a runner with keep_max 10,000, beside a file that
/// holds only 10,000 finished jobs.
fn steady_state() {
    const TOTAL: usize = 200_000;
    const CHUNK: usize = 5_000;
    const EVERY: usize = 50_000;
    const KEEP: u64 = 10_000;
    let dir = tempfile::tempdir().expect("a temporary folder can be created");
    let path = dir.path().join("steady.db");
    incremental_file(&path);
    let runner = leasehold::Runner::builder(&path)
        .workers(WORKERS)
        .durability(Durability::Normal)
        .retention(Retention::keep_all().keep_max(Some(KEEP)))
        // The cap is applied once a sweep: at ~2,000 jobs/s a 5 s sweep lets ~10,000 jobs
        // past it between sweeps, a 1 s sweep ~2,000.
        .sweep_interval(Duration::from_secs(1))
        .start()
        .expect("the runner starts");
    let watch = Store::open(&path).expect("the bench database opens");
    let t = Instant::now();
    let mut done = 0;
    let mut sizes = Vec::new();
    while done < TOTAL {
        runner
            .enqueue_many(&vec![Job::command(["/bin/true"]); CHUNK])
            .expect("the jobs are enqueued");
        while watch.has_unfinished(&[]).expect("the bench database reads") {
            std::thread::sleep(Duration::from_millis(20));
        }
        done += CHUNK;
        if done % EVERY == 0 {
            let finished = watch.counts().expect("counts").succeeded;
            let wal = file_bytes(&path) - std::fs::metadata(&path).map(|m| m.len()).unwrap_or(0);
            sizes.push((done, file_bytes(&path), finished, wal));
        }
    }
    let rate = TOTAL as f64 / t.elapsed().as_secs_f64();
    runner.shutdown().expect("the runner shuts down");

    // The baseline: only 10,000 finished jobs, never pruned.
    let base_path = dir.path().join("base.db");
    incremental_file(&base_path);
    let runner = leasehold::Runner::builder(&base_path)
        .workers(WORKERS)
        .durability(Durability::Normal)
        .retention(Retention::keep_all())
        .start()
        .expect("the runner starts");
    let base_watch = Store::open(&base_path).expect("the bench database opens");
    runner
        .enqueue_many(&vec![Job::command(["/bin/true"]); KEEP as usize])
        .expect("the jobs are enqueued");
    while base_watch
        .has_unfinished(&[])
        .expect("the bench database reads")
    {
        std::thread::sleep(Duration::from_millis(20));
    }
    runner.shutdown().expect("the runner shuts down");
    let base = file_bytes(&base_path);
    for (n, bytes, finished, wal) in sizes {
        println!(
            "{:<50} {:>18} {:>18} {:>7.2}",
            format!(
                "after {}k jobs: {}k kept, WAL {}",
                n / 1000,
                finished / 1000,
                mib(wal)
            ),
            mib(bytes),
            mib(base),
            bytes as f64 / base as f64
        );
    }
    println!(
        "  {} × /bin/true at {} jobs/s (NORMAL, sweep 1 s); baseline: a file of only 10,000",
        thousands(TOTAL as f64),
        thousands(rate)
    );
    println!("  finished jobs (db + WAL both). Both files incremental (auto_vacuum) as schema");
    println!("  v2 makes them.");
}

/// The longest claim while 500,000 finished jobs are pruned, beside the longest claim with no
/// prune running.
fn claim_latency_during_prune() {
    const FINISHED: usize = 500_000;
    let dir = tempfile::tempdir().expect("a temporary folder can be created");
    let path = dir.path().join("big.db");
    incremental_file(&path);
    let store = Store::open(&path).expect("the bench database opens");
    let now = now_ms();
    for _ in 0..FINISHED / 100_000 {
        store
            .enqueue_many_at(&vec![Job::command(["/bin/true"]); 100_000], now - DAY_MS)
            .expect("the jobs are enqueued");
    }
    bare_open(&path, Durability::Normal)
        .execute(
            "UPDATE jobs SET status = 'succeeded', attempt = 1, exit_code = 0,
                 started_at = ?1, completed_at = ?1 + id",
            params![now - DAY_MS],
        )
        .expect("the jobs are finished by SQL");
    let before = file_bytes(&path);
    // The claimer's own jobs: ready, never due for pruning while it runs.
    store
        .enqueue_many_at(&vec![Job::command(["/bin/true"]); 50_000], now - DAY_MS)
        .expect("the claimer's jobs are enqueued");

    let claim_max = |stop: &std::sync::atomic::AtomicBool, limit: usize| {
        let claimer = Store::open(&path).expect("the bench database opens");
        let mut worst = Duration::ZERO;
        let mut claims = 0;
        while !stop.load(std::sync::atomic::Ordering::Relaxed) && claims < limit {
            let t = Instant::now();
            let Some(c) = claim_one(&claimer, now_ms()) else {
                break;
            };
            worst = worst.max(t.elapsed());
            claims += 1;
            let finish = Finish {
                job_id: c.id,
                run_token: c.run_token.clone(),
                attempt: c.attempt,
                ending: Ending::Succeeded,
                output: None,
                notes: Vec::new(),
                max_recovery_attempts: 3,
            };
            claimer
                .finish(&finish, now_ms())
                .expect("the ending is recorded");
        }
        (worst, claims)
    };
    // The setup's bulk UPDATE left a WAL of about 200 MB: checkpoint it now, so that the
    // figure is the prune's own (a runner's WAL stays bounded).
    bare_open(&path, Durability::Normal)
        .query_row("PRAGMA wal_checkpoint(TRUNCATE)", [], |r| {
            r.get::<_, i64>(0)
        })
        .expect("the setup's WAL is checkpointed");
    let never = std::sync::atomic::AtomicBool::new(false);
    let (idle_worst, idle_claims) = claim_max(&never, 2000);

    let stop = std::sync::atomic::AtomicBool::new(false);
    let (report, took, (worst, claims)) = std::thread::scope(|s| {
        let claimer = s.spawn(|| claim_max(&stop, usize::MAX));
        let t = Instant::now();
        let policy = Retention::keep_all().succeeded(Some(Duration::from_secs(3600)));
        // As the sweeper prunes: rounds of a few batches, each round then vacuumed, within
        // half the default sweep interval.
        let mut report = leasehold::PruneReport::default();
        let mut longest_round = Duration::ZERO;
        loop {
            let round = Instant::now();
            let r = store
                .prune_with(
                    &policy,
                    &PruneOptions::default()
                        .max_batches(Some(8))
                        .max_vacuum_steps(Some(16))
                        .deadline(round.checked_add(ROUND_BUDGET)),
                )
                .expect("the prune runs");
            longest_round = longest_round.max(round.elapsed());
            report.jobs += r.jobs;
            report.batches += r.batches;
            report.bytes_freed += r.bytes_freed;
            // As sweeps go on after the last batch: until the free list is given back.
            if !r.more && r.bytes_freed == 0 {
                break;
            }
        }
        println!(
            "  longest round of 8 batches + its vacuum (at most 16 MiB, none started past {} ms): \
             {:.0} ms",
            ROUND_BUDGET.as_millis(),
            longest_round.as_secs_f64() * 1000.0
        );
        let took = t.elapsed();
        stop.store(true, std::sync::atomic::Ordering::Relaxed);
        (
            report,
            took,
            claimer.join().expect("the claimer does not panic"),
        )
    });
    let after = file_bytes(&path);
    println!(
        "{:<50} {:>18} {:>18} {:>7.2}",
        "longest claim: during a 500,000-job prune / none",
        format!("{:.1} ms", worst.as_secs_f64() * 1000.0),
        format!("{:.1} ms", idle_worst.as_secs_f64() * 1000.0),
        worst.as_secs_f64() / idle_worst.as_secs_f64()
    );
    println!(
        "  pruned {} jobs in {:.1} s ({} batches, {} jobs/s) while {} claims+finishes ran",
        thousands(report.jobs as f64),
        took.as_secs_f64(),
        report.batches,
        thousands(report.jobs as f64 / took.as_secs_f64()),
        claims
    );
    println!(
        "  (baseline: {idle_claims} claims with no prune); file {} -> {} (freed {})",
        mib(before),
        mib(after),
        mib(report.bytes_freed)
    );
}

// ---------------------------------------------------------------------------------------------
// Flow control: dependencies and queue settings

/// Claim rates from 1,000 ready jobs, alone and beside what a claim must not read: 100,000
/// jobs waiting for a dependency (at a higher priority), and 100,000 ready jobs of a paused
/// queue (a pause or a limit sends every claim through the limited path: one index head per
/// queue, and a count of the limited queue's running jobs).
fn flow_benchmarks() {
    // Many short rounds taken in turn: this machine is shared, and a median of many rounds
    // is what survives its noise.
    const ROUNDS: usize = 21;
    const CLAIMS: usize = 200;
    const BESIDE: usize = 100_000;
    const NOT_DUE: usize = 1_000_000;
    let dir = tempfile::tempdir().expect("a temporary folder can be created");
    println!();
    heading("flow (NORMAL)", "beside", "alone");
    let ready = vec![Job::command(["true"]); 1000];
    let build = |name: &str, extra: &dyn Fn(&Store, i64)| {
        let path = dir.path().join(format!("{name}.db"));
        let now = now_ms();
        let store = open(&path, Durability::Normal);
        extra(&store, now);
        store.enqueue_many_at(&ready, now).expect("enqueue_many");
        let bare = bare_open(&path, Durability::Normal);
        (store, bare, now)
    };
    let alone = build("alone", &|_, _| {});
    let waiting = build("waiting", &|store, now| {
        // One of the ready jobs: claimed and put back each round, never finished.
        let blocker = store
            .enqueue_at(&Job::command(["true"]), now)
            .expect("enqueue");
        let jobs = vec![Job::command(["true"]).priority(10).after([blocker]); BESIDE];
        store.enqueue_many_at(&jobs, now).expect("enqueue_many");
    });
    let paused = build("paused", &|store, now| {
        let jobs = vec![Job::command(["true"]).priority(10).queue("sync"); BESIDE];
        store.enqueue_many_at(&jobs, now).expect("enqueue_many");
        store.pause_queue("sync").expect("pause");
    });
    let not_due = build("not-due", &|store, now| {
        // Due in an hour, at a higher priority than every ready job: deferred, out of the
        // claim indexes (schema 14), so a claim never steps over them.
        let jobs = vec![
            Job::command(["true"])
                .priority(10)
                .delay(Duration::from_secs(3600));
            NOT_DUE
        ];
        store.enqueue_many_at(&jobs, now).expect("enqueue_many");
    });
    let limited = build("limited", &|store, _| {
        store.set_queue_limit("other", Some(2)).expect("limit");
    });
    let cases = [
        ("claim 1 job, 100,000 waiting beside 1,000 ready", &waiting),
        ("claim 1 job, 100,000 of a paused queue beside", &paused),
        (
            "claim 1 job, 1,000,000 not yet due, higher priority",
            &not_due,
        ),
        ("claim 1 job, a limit on another queue", &limited),
    ];
    let round = |(store, bare, now): &(Store, Connection, i64)| {
        let t = Instant::now();
        for _ in 0..CLAIMS {
            claim_one(store, *now).expect("a job is ready");
        }
        let took = t.elapsed();
        requeue_running(bare);
        took
    };
    let mut base = Vec::new();
    let mut times: Vec<Vec<Duration>> = vec![Vec::new(); cases.len()];
    // Rounds taken in turn, so a noisy moment of this shared machine falls on each alike.
    for _ in 0..ROUNDS {
        base.push(round(&alone));
        for (i, (_, case)) in cases.iter().enumerate() {
            times[i].push(round(case));
        }
    }
    let base = median(base);
    let rate = |d: Duration| format!("{} claims/s", thousands(CLAIMS as f64 / d.as_secs_f64()));
    for ((label, _), t) in cases.iter().zip(times) {
        let t = median(t);
        let ratio = t.as_secs_f64() / base.as_secs_f64();
        println!(
            "{label:<50} {:>18} {:>18} {ratio:>7.2}",
            rate(t),
            rate(base)
        );
    }
    println!(
        "  (median of {ROUNDS} rounds of {CLAIMS} claims, the files' rounds taken in turn; goal for"
    );
    println!("   the waiting and the not-yet-due jobs: within 1.2x of alone)");
}

// ---------------------------------------------------------------------------------------------
// Printing

// ---------------------------------------------------------------------------------------------
// Metrics

/// A scrape (`Store::metrics` and its rendering) of a file of 1,000,000 jobs in 4 queues, a
/// tenth pending and the rest finished, beside counting the table with plain SQL.
fn metrics_benchmarks() {
    const SCRAPES: usize = 20;
    let dir = tempfile::tempdir().expect("a temporary folder can be created");
    let path = dir.path().join("metrics.db");
    let mut table = Table::new("metrics: 1,000,000 jobs");
    let setup = Instant::now();
    let now = now_ms();
    {
        let store = open(&path, Durability::Normal);
        let queues = ["default", "mail", "video", "reports"];
        let chunk: Vec<Job> = (0..100_000)
            .map(|i| Job::command(["true"]).queue(queues[i % 4]))
            .collect();
        for _ in 0..10 {
            store.enqueue_many_at(&chunk, now).expect("enqueue_many");
        }
        // Real endings for the counters and histograms (their rows do not grow with the jobs:
        // queues x outcomes x buckets), then most of the table finished in bulk.
        for i in 0..2_000 {
            let c = claim_one(&store, now).expect("a job is ready");
            let ending = if i % 5 == 0 {
                Ending::Failed {
                    kind: leasehold::ErrorKind::Exit,
                    exit_code: Some(1),
                    signal: None,
                    message: "exit 1".into(),
                }
            } else {
                Ending::Succeeded
            };
            let finish = Finish {
                job_id: c.id,
                run_token: c.run_token,
                attempt: c.attempt,
                ending,
                output: None,
                notes: Vec::new(),
                max_recovery_attempts: 3,
            };
            store.finish(&finish, now + i).expect("finish");
        }
    }
    let bare = bare_open(&path, Durability::Normal);
    bare.execute(
        "UPDATE jobs SET status = CASE WHEN id % 7 = 0 THEN 'failed' ELSE 'succeeded' END,
             completed_at = ?1
         WHERE status = 'pending' AND id % 10 != 0",
        [now],
    )
    .expect("finish most jobs");
    let store = open(&path, Durability::Normal);
    let built = setup.elapsed();
    let time = |f: &mut dyn FnMut()| -> Duration {
        f(); // warm the cache
        let times: Vec<Duration> = (0..SCRAPES)
            .map(|_| {
                let t = Instant::now();
                f();
                t.elapsed()
            })
            .collect();
        median(times)
    };
    let mut bytes = 0;
    let scrape = time(&mut || {
        bytes = store.metrics().expect("metrics").to_prometheus().len();
    });
    let bare = &bare;
    let count = |sql: &'static str| {
        move || {
            let _: i64 = bare.query_row(sql, [], |r| r.get(0)).expect("count");
        }
    };
    let count_all = time(&mut count("SELECT count(*) FROM jobs"));
    let by_status = time(&mut count(
        "SELECT count(*) FROM (SELECT status, count(*) FROM jobs GROUP BY status)",
    ));
    let by_queue = time(&mut count(
        "SELECT count(*) FROM (SELECT queue, status, count(*) FROM jobs GROUP BY queue, status)",
    ));
    table.per_call("scrape / SELECT count(*) FROM jobs", 1, scrape, count_all);
    table.per_call("scrape / count GROUP BY status", 1, scrape, by_status);
    table.per_call("scrape / count GROUP BY queue, status", 1, scrape, by_queue);
    let verdict = if scrape < Duration::from_millis(50) {
        "under"
    } else {
        "NOT under"
    };
    table.note(&format!(
        "  median of {SCRAPES}; the scrape is Store::metrics + to_prometheus ({bytes} bytes of text),"
    ));
    table.note(&format!(
        "  {verdict} the 50 ms goal; file built in {:.1} s ({}).",
        built.as_secs_f64(),
        mib(file_bytes(&path))
    ));
    metrics_write_cost(&dir);
}

/// What the job counts' triggers and the queue-lag index cost leasehold's writes: the same
/// store calls on a file with them and on one where they were dropped, in alternated rounds.
/// (The counters' own upserts are in both: they are in the code, not the schema.)
fn metrics_writes_only() {
    let dir = tempfile::tempdir().expect("a temporary folder can be created");
    metrics_write_cost(&dir);
}

fn metrics_write_cost(dir: &TempDir) {
    const ROUNDS: usize = 5;
    const ENQUEUES: usize = 100_000;
    const CYCLES: usize = 3_000;
    println!();
    heading(
        "metrics: cost on writes (leasehold, NORMAL)",
        "with triggers",
        "without",
    );
    let fresh = |name: String, with: bool| {
        let path = dir.path().join(name);
        let store = open(&path, Durability::Normal);
        if !with {
            bare_open(&path, Durability::Normal)
                .execute_batch(
                    "DROP TRIGGER job_counts_update; DROP TRIGGER job_counts_delete;
                     DROP INDEX jobs_pending_due;",
                )
                .expect("drop the metrics' triggers and index");
        }
        store
    };
    let now = now_ms();
    let jobs = vec![Job::command(["true"]); ENQUEUES];
    let enqueue = |store: &Store| {
        let t = Instant::now();
        store.enqueue_many_at(&jobs, now).expect("enqueue_many");
        t.elapsed()
    };
    let cycles = |store: &Store| {
        let t = Instant::now();
        for _ in 0..CYCLES {
            let c = claim_one(store, now).expect("a job is ready");
            let finish = Finish {
                job_id: c.id,
                run_token: c.run_token,
                attempt: c.attempt,
                ending: Ending::Succeeded,
                output: None,
                notes: Vec::new(),
                max_recovery_attempts: 3,
            };
            store.finish(&finish, now).expect("finish");
        }
        t.elapsed()
    };
    let (mut enq, mut cyc) = ((Vec::new(), Vec::new()), (Vec::new(), Vec::new()));
    for round in 0..ROUNDS {
        for with in [true, false] {
            let store = fresh(format!("cost-{round}-{with}.db"), with);
            let e = enqueue(&store);
            let c = cycles(&store);
            if with {
                enq.0.push(e);
                cyc.0.push(c);
            } else {
                enq.1.push(e);
                cyc.1.push(c);
            }
        }
    }
    for (label, n, unit, (with, without)) in [
        (
            "batch enqueue, 100,000 jobs in 1 txn",
            ENQUEUES,
            "jobs/s",
            enq,
        ),
        (
            "claim + finish, no process, 3,000 cycles",
            CYCLES,
            "cycles/s",
            cyc,
        ),
    ] {
        let (with, without) = (median(with), median(without));
        println!(
            "{label:<50} {:>18} {:>18} {:>7.2}",
            format!("{} {unit}", thousands(n as f64 / with.as_secs_f64())),
            format!("{} {unit}", thousands(n as f64 / without.as_secs_f64())),
            with.as_secs_f64() / without.as_secs_f64()
        );
    }
    println!(
        "  ratio = time with the triggers and index / without; median of {ROUNDS} alternated rounds"
    );
}

// ---------------------------------------------------------------------------------------------
// Printing

/// A table's heading: its title and what its two columns of figures are, over a rule.
fn heading(title: &str, ours: &str, baseline: &str) {
    println!("{title:<50} {ours:>18} {baseline:>18} {:>7}", "ratio");
    println!("{}", "-".repeat(50 + 18 + 18 + 7 + 3));
}

/// An aligned table printed as it goes, so a long run shows progress.
struct Table;

impl Table {
    fn new(title: &str) -> Table {
        heading(title, "leasehold", "bare rusqlite");
        Table
    }

    /// A throughput: `n` operations in `ours` (and in `bare`).
    fn rate(&mut self, label: &str, n: usize, ours: Duration, bare: Option<Duration>, unit: &str) {
        let rate = |d: Duration| format!("{} {unit}", thousands(n as f64 / d.as_secs_f64()));
        let (bare_text, ratio) = match bare {
            Some(b) => (
                rate(b),
                format!("{:.2}", ours.as_secs_f64() / b.as_secs_f64()),
            ),
            None => (String::new(), String::new()),
        };
        println!("{label:<50} {:>18} {bare_text:>18} {ratio:>7}", rate(ours));
    }

    /// A latency: `calls` calls in `ours` and in `bare`.
    fn per_call(&mut self, label: &str, calls: usize, ours: Duration, bare: Duration) {
        let ms = |d: Duration| format!("{:.2} ms/call", d.as_secs_f64() * 1000.0 / calls as f64);
        let ratio = format!("{:.2}", ours.as_secs_f64() / bare.as_secs_f64());
        println!("{label:<50} {:>18} {:>18} {ratio:>7}", ms(ours), ms(bare));
    }

    fn note(&mut self, text: &str) {
        println!("{text}");
    }
}

/// `1234567.8` as `1,234,568`.
fn thousands(x: f64) -> String {
    let digits = format!("{:.0}", x);
    let mut out = String::new();
    for (i, c) in digits.chars().enumerate() {
        if i > 0 && (digits.len() - i) % 3 == 0 {
            out.push(',');
        }
        out.push(c);
    }
    out
}

// ---------------------------------------------------------------------------------------------
// The dashboard

/// `leasehold serve` on a file of 1,000,000 jobs (98% succeeded, 1% failed, 1% pending, three
/// queues, one paused with a limit; three schedules; and 1,000 more jobs waiting for a
/// dependency): each page fetched over HTTP on a fresh connection (the request, the reads, the
/// HTML), beside a bare `SELECT count(*) FROM jobs` on the same file, the cheapest question
/// one can ask it. The goal is under 100 ms a page.
fn serve_benchmarks() {
    const N: usize = 1_000_000;
    const ROUNDS: usize = 21;
    // The binary sits beside the examples' folder: target/release/leasehold.
    let bin = std::env::current_exe()
        .ok()
        .and_then(|exe| Some(exe.parent()?.parent()?.join("leasehold")))
        .filter(|p| p.exists());
    let Some(bin) = bin else {
        println!("\nserve: skipped: build the binary first (cargo build --release)");
        return;
    };
    let dir = tempfile::tempdir().expect("a temporary folder can be created");
    let path = dir.path().join("serve.db");
    let setup = Instant::now();
    {
        let store = open(&path, Durability::Normal);
        let queues = ["default", "mail", "reports"];
        // A queue of 10 old jobs: finding them newest first must not read the million
        // newer ones.
        let rare: Vec<Job> = (0..10)
            .map(|_| Job::command(["true"]).queue("rare"))
            .collect();
        store.enqueue_many(&rare).expect("enqueue_many");
        for chunk in 0..10 {
            let jobs: Vec<Job> = (0..N / 10)
                .map(|i| Job::command(["true"]).queue(queues[(chunk + i) % 3]))
                .collect();
            store.enqueue_many(&jobs).expect("enqueue_many");
        }
        let conn = bare_open(&path, Durability::Normal);
        conn.execute_batch(&format!(
            "UPDATE jobs SET status = CASE WHEN id % 100 = 0 THEN 'failed' ELSE 'succeeded' END,
                 attempt = 1, started_at = created_at, completed_at = created_at + 5,
                 exit_code = CASE WHEN id % 100 = 0 THEN 1 ELSE 0 END
             WHERE id <= {};",
            N - N / 100
        ))
        .expect("finish 99% of the jobs");
        // The failed jobs' `failed` events, which the overview's recent failures read.
        conn.execute_batch(
            "INSERT INTO job_events (job_id, at, kind, attempt, detail)
             SELECT id, completed_at, 'failed', 1, 'exit 1' FROM jobs WHERE status = 'failed';",
        )
        .expect("failure events");
        // What the overview shows of schedules and flow control: a paused queue with a
        // limit, a few schedules, and 1,000 jobs waiting for a pending one.
        store.set_queue_limit("mail", Some(4)).expect("limit");
        store.pause_queue("mail").expect("pause");
        for (name, every) in [("minutely", 60), ("hourly", 3600), ("daily", 86_400)] {
            let schedule = leasehold::Schedule::every(Duration::from_secs(every))
                .job(Job::command(["true"]).queue("reports"));
            store.put_schedule(name, &schedule).expect("put_schedule");
        }
        let waiting: Vec<Job> = (0..1000)
            .map(|_| Job::command(["true"]).queue("reports").after([N as i64]))
            .collect();
        store.enqueue_many(&waiting).expect("waiting jobs");
        // The charts' samples, as a runner's sweeper keeps them (the most there ever are):
        // the newest 61 a minute apart, and 25 coarse ones an hour apart.
        let now = now_ms();
        let buckets = |k: i64| {
            (0..19)
                .map(|b| (k * (b + 1)).to_string())
                .collect::<Vec<_>>()
                .join(",")
        };
        let mut insert = conn
            .prepare(
                "INSERT INTO metric_samples (at, coarse, running, ready, succeeded, failed,
                     lost, cancelled, retried, wait, run)
                 VALUES (?1, ?2, 4, 100, ?3, ?4, 0, 0, ?4, ?5, ?5)",
            )
            .expect("prepare");
        for (i, coarse) in (0..61)
            .map(|i| (i, false))
            .chain((1..26).map(|i| (i * 60 + 1, true)))
        {
            let at = now - i * 60_000;
            let k = 100_000 - i;
            insert
                .execute(rusqlite::params![at, coarse, k * 50, k / 2, buckets(k)])
                .expect("a sample");
        }
    }
    let built = setup.elapsed();
    let mut child = std::process::Command::new(&bin)
        .arg("--db")
        .arg(&path)
        .args(["serve", "--listen", "127.0.0.1:0"])
        .env("RUST_LOG", "warn")
        .stdout(std::process::Stdio::piped())
        .spawn()
        .expect("leasehold serve starts");
    let mut line = String::new();
    {
        use std::io::BufRead;
        let stdout = child.stdout.take().expect("piped");
        std::io::BufReader::new(stdout)
            .read_line(&mut line)
            .expect("serve prints its URL");
    }
    // The login URL: http://ADDR/login?token=SECRET, which answers with the session cookie.
    let (addr, secret) = line
        .trim()
        .trim_start_matches("http://")
        .split_once("/login?token=")
        .expect("serve prints its login URL");
    let addr: std::net::SocketAddr = addr.parse().expect("an address");
    let fetch = |target: &str, cookie: &str| -> Vec<u8> {
        use std::io::{Read, Write};
        let mut s = std::net::TcpStream::connect(addr).expect("connect");
        write!(
            s,
            "GET {target} HTTP/1.1\r\nHost: {addr}\r\nCookie: {cookie}\r\n\r\n"
        )
        .expect("send");
        let mut bytes = Vec::new();
        s.read_to_end(&mut bytes).expect("read");
        bytes
    };
    let login = String::from_utf8_lossy(&fetch(&format!("/login?token={secret}"), "")).into_owned();
    let cookie = login
        .lines()
        .find_map(|l| l.strip_prefix("Set-Cookie: "))
        .and_then(|c| c.split(';').next())
        .expect("the login sets the session cookie")
        .to_string();
    let get = |target: &str| -> (u16, usize) {
        let bytes = fetch(target, &cookie);
        let status = String::from_utf8_lossy(&bytes[9..12]).parse().unwrap_or(0);
        (status, bytes.len())
    };
    let conn = bare_open(&path, Durability::Normal);
    let bare = median(
        (0..ROUNDS)
            .map(|_| {
                let t = Instant::now();
                let n: i64 = conn
                    .query_row("SELECT count(*) FROM jobs", [], |r| r.get(0))
                    .unwrap();
                assert_eq!(n as usize, N + 1010);
                t.elapsed()
            })
            .collect(),
    );
    let mut table = Table::new("serve: 1,000,000 jobs, one GET each");
    let pages = [
        ("/", "overview /"),
        ("/metrics", "/metrics (exposition)"),
        ("/jobs", "job list, page 1"),
        ("/jobs?status=failed", "job list, failed, page 1"),
        (
            "/jobs?queue=mail&before=999000",
            "job list, queue mail, page 2",
        ),
        ("/jobs?before=500000", "job list, 500,000 jobs in (before=)"),
        ("/jobs?queue=rare", "job list, queue rare (10 oldest jobs)"),
        (
            "/jobs?status=failed&queue=mail",
            "job list, failed in queue mail",
        ),
        ("/jobs/999999", "one job"),
    ];
    for (target, label) in pages {
        let (status, _) = get(target); // warm
        assert_eq!(status, 200, "{target}");
        let times: Vec<Duration> = (0..ROUNDS)
            .map(|_| {
                let t = Instant::now();
                get(target);
                t.elapsed()
            })
            .collect();
        table.per_call(label, 1, median(times), bare);
    }
    table.note(&format!(
        "  median of {ROUNDS} GETs each; baseline: bare SELECT count(*) FROM jobs \
         ({:.2} ms); file built in {:.1} s",
        bare.as_secs_f64() * 1000.0,
        built.as_secs_f64()
    ));
    let _ = child.kill();
    let _ = child.wait();
}

// ---------------------------------------------------------------------------------------------
// Wake-up, start and stop, the idle runner, and feeding a runner from a shell

/// How many jobs the latency figures enqueue one at a time.
const LATENCY_JOBS: usize = 200;
/// How many `jobs add` calls feed a running runner (and `tsp -n` calls feed task-spooler).
const FED_JOBS: usize = 2000;

fn wake_benchmarks() {
    println!();
    heading("wake-up, start/stop, idle", "leasehold", "baseline");
    println!("(the runners here run with keepers on, the default)");
    let cli = cli_binary();
    if cli.is_none() {
        println!("(no target/release/leasehold: `cargo build --release` first for the CLI rows)");
    }
    enqueue_to_start_latency(cli.as_deref());
    due_to_start_latency();
    start_to_stop(cli.as_deref());
    idle_cpu();
    if let Some(cli) = &cli {
        fed_by_the_shell(cli);
    }
}

/// Jobs due later (`delay`) start when due, not at the next poll: 50 jobs enqueued one at a
/// time, each 300 ms ahead, after the previous one ended; from `scheduled_at` to the claim
/// (`started_at`), beside the default fallback poll that bounded it before.
fn due_to_start_latency() {
    let dir = tempfile::tempdir().expect("a temporary folder can be created");
    let path = dir.path().join("due.db");
    let runner = leasehold::Runner::builder(&path)
        .workers(WORKERS)
        .start()
        .expect("the runner starts");
    let watch = Store::open(&path).expect("the bench database opens");
    let mut late: Vec<i64> = (0..50)
        .map(|_| {
            let id = runner
                .enqueue(&Job::command(["/bin/true"]).delay(Duration::from_millis(300)))
                .expect("the job is enqueued");
            runner
                .wait(id, Duration::from_secs(30))
                .expect("the wait works")
                .expect("the job ends");
            let job = watch.job(id).expect("the job reads");
            job.started_at.expect("the job started") - job.scheduled_at
        })
        .collect();
    runner.shutdown().expect("the runner shuts down");
    late.sort_unstable();
    let poll = leasehold::DEFAULT_POLL_INTERVAL.as_millis();
    for (name, q) in [("p50", 0.5), ("p99", 0.99)] {
        let ms = quantile(&late, q);
        println!(
            "{:<50} {:>18} {:>18} {:>7.2}",
            format!("due-to-start of a delayed job / the poll, {name}"),
            format!("{ms} ms"),
            format!("{poll} ms"),
            ms as f64 / poll as f64
        );
    }
    println!(
        "  50 jobs 300 ms ahead, one at a time; baseline: the fallback poll, which bounded it before"
    );
}

/// The `leasehold` binary beside this example's folder (`target/release/leasehold`).
fn cli_binary() -> Option<std::path::PathBuf> {
    let exe = std::env::current_exe().ok()?;
    let bin = exe.parent()?.parent()?.join("leasehold");
    bin.is_file().then_some(bin)
}

/// Milliseconds at quantile `q` of `sorted`.
fn quantile(sorted: &[i64], q: f64) -> i64 {
    let i = ((sorted.len() - 1) as f64 * q).round() as usize;
    sorted[i]
}

/// Enqueues `n` jobs one at a time with `enqueue`, waiting for each to end before the next;
/// returns the milliseconds from each enqueue (its `created_at`) to its claim (`started_at`),
/// sorted.
fn latencies(watch: &Store, n: usize, mut enqueue: impl FnMut() -> i64) -> Vec<i64> {
    let mut ms: Vec<i64> = (0..n)
        .map(|_| {
            let id = enqueue();
            let job = loop {
                let job = watch.job(id).expect("the job reads");
                if job.completed_at.is_some() {
                    break job;
                }
                std::thread::sleep(Duration::from_micros(200));
            };
            // Let the runner settle back into its wait: the ending of one job must not be
            // what wakes it for the next.
            std::thread::sleep(Duration::from_millis(5));
            job.started_at.expect("it started") - job.created_at
        })
        .collect();
    ms.sort_unstable();
    ms
}

fn print_latency(label: &str, ours: &[i64], base: &[i64]) {
    for (q, name) in [(0.5, "p50"), (0.99, "p99")] {
        let (a, b) = (quantile(ours, q), quantile(base, q));
        println!(
            "{:<50} {:>18} {:>18} {:>7}",
            format!("{label}, {name}"),
            format!("{a} ms"),
            format!("{b} ms"),
            if b > 0 {
                format!("{:.2}", a as f64 / b as f64)
            } else {
                String::new()
            }
        );
    }
}

/// Enqueue-to-start from another process (the CLI, or a second `Store` when the binary is not
/// built), beside an in-process `Runner::enqueue`, and beside the poll alone (the wake-up
/// folder removed) as it was before the wake-up existed.
fn enqueue_to_start_latency(cli: Option<&std::path::Path>) {
    let dir = tempfile::tempdir().expect("a temporary folder can be created");
    let path = dir.path().join("latency.db");
    let runner = leasehold::Runner::builder(&path)
        .workers(WORKERS)
        .start()
        .expect("the runner starts");
    let watch = Store::open(&path).expect("the bench database opens");
    let own = latencies(&watch, LATENCY_JOBS, || {
        runner
            .enqueue(&Job::command(["/bin/true"]))
            .expect("enqueue")
    });
    let second = Store::open(&path).expect("the bench database opens");
    let other = latencies(&watch, LATENCY_JOBS, || match cli {
        Some(cli) => {
            let out = std::process::Command::new(cli)
                .arg("--db")
                .arg(&path)
                .args(["jobs", "add", "--json", "--", "/bin/true"])
                .output()
                .expect("leasehold jobs add runs");
            assert!(out.status.success(), "{out:?}");
            let v: serde_json::Value = serde_json::from_slice(&out.stdout).expect("JSON");
            v["id"].as_i64().expect("an id")
        }
        None => second
            .enqueue(&Job::command(["/bin/true"]))
            .expect("enqueue"),
    });
    let by = if cli.is_some() {
        "`jobs add`"
    } else {
        "a 2nd Store"
    };
    print_latency(
        &format!("enqueue-to-start by {by} / Runner::enqueue"),
        &other,
        &own,
    );
    // The poll alone: every socket gone, so the runner finds the job on its next poll.
    let folder = {
        let mut name = path.as_os_str().to_os_string();
        name.push("-wake");
        std::path::PathBuf::from(name)
    };
    std::fs::remove_dir_all(&folder).expect("the wake-up folder can be removed");
    let polled = latencies(&watch, 50, || {
        second
            .enqueue(&Job::command(["/bin/true"]))
            .expect("enqueue")
    });
    print_latency(
        "enqueue-to-start by a 2nd Store / the poll alone",
        &other,
        &polled,
    );
    println!(
        "  {LATENCY_JOBS} jobs one at a time; the poll alone: 50 jobs with the wake-up folder \
         removed (poll {} ms)",
        leasehold::DEFAULT_POLL_INTERVAL.as_millis()
    );
    runner.shutdown().expect("the runner shuts down");
}

/// Start-to-stop of an idle runner: `Runner::start` then `shutdown` on an empty file, and
/// `leasehold run --until-idle` beside starting `/bin/true`.
fn start_to_stop(cli: Option<&std::path::Path>) {
    const ROUNDS: usize = 20;
    let dir = tempfile::tempdir().expect("a temporary folder can be created");
    let path = dir.path().join("idle.db");
    drop(Store::open(&path).expect("the bench database opens"));
    let mut lib: Vec<Duration> = (0..ROUNDS)
        .map(|_| {
            let t = Instant::now();
            let runner = leasehold::Runner::builder(&path)
                .start()
                .expect("the runner starts");
            runner.shutdown().expect("the runner shuts down");
            t.elapsed()
        })
        .collect();
    lib.sort();
    let ms = |d: Duration| format!("{:.1} ms", d.as_secs_f64() * 1000.0);
    println!(
        "{:<50} {:>18} {:>18} {:>7}",
        "Runner::start + shutdown, idle, median",
        ms(lib[ROUNDS / 2]),
        "goal < 20 ms",
        ""
    );
    if let Some(cli) = cli {
        let time = |cmd: &mut std::process::Command| {
            let mut runs: Vec<Duration> = (0..ROUNDS)
                .map(|_| {
                    let t = Instant::now();
                    let status = cmd.status().expect("the command runs");
                    assert!(status.success());
                    t.elapsed()
                })
                .collect();
            runs.sort();
            runs[ROUNDS / 2]
        };
        let ours = time(
            std::process::Command::new(cli)
                .arg("--db")
                .arg(&path)
                .args(["run", "--until-idle"])
                .env("RUST_LOG", "warn"),
        );
        let base = time(&mut std::process::Command::new("/bin/true"));
        println!(
            "{:<50} {:>18} {:>18} {:>7.2}",
            "`run --until-idle` / `/bin/true`, median",
            ms(ours),
            ms(base),
            ours.as_secs_f64() / base.as_secs_f64()
        );
    }
    println!("  median of {ROUNDS} on an existing empty file");
}

/// The CPU an idle runner burns over 10 s, from `getrusage` of this process.
fn idle_cpu() {
    use nix::sys::resource::{UsageWho, getrusage};
    let cpu = || {
        let u = getrusage(UsageWho::RUSAGE_SELF).expect("getrusage");
        let t = |tv: nix::sys::time::TimeVal| tv.tv_sec() as f64 + tv.tv_usec() as f64 / 1e6;
        t(u.user_time()) + t(u.system_time())
    };
    let dir = tempfile::tempdir().expect("a temporary folder can be created");
    let path = dir.path().join("idle-cpu.db");
    let runner = leasehold::Runner::builder(&path)
        .workers(WORKERS)
        .start()
        .expect("the runner starts");
    // Let the start settle; then measure the idle runner alone.
    std::thread::sleep(Duration::from_millis(200));
    let before = cpu();
    std::thread::sleep(Duration::from_secs(10));
    let used = cpu() - before;
    runner.shutdown().expect("the runner shuts down");
    println!(
        "{:<50} {:>18} {:>18} {:>7}",
        "idle runner CPU over 10 s (4 workers)",
        format!("{used:.4} core-s"),
        "goal < 0.01",
        ""
    );
}

/// One `leasehold jobs add` per job into a running runner (4 workers), beside task-spooler's
/// `tsp -n` fed the same way (4 slots), and the floor of such a call, part by part.
///
/// A handed `jobs add` returns only once the runner has committed its job durably (FULL), and
/// the shell starts the next one only then, so a call costs at least: the start and exit of
/// the binary, the datagram round trip, and the runner's commit. The first two are timed as
/// `jobs add` answered at once by a thread that stores nothing ([`Answerer`]), the commit as
/// an in-process `Store::hand_off` less the round trip, each beside `jobs add` calls whose
/// jobs are not run (a queue the runner does not serve), in [`FEED_ROUNDS`] interleaved
/// rounds (this machine's load and disk drift; the median round of each is shown). Then
/// 2,000 `sh -c true` jobs are fed and run, first add to last ending, in rounds that
/// alternate with `tsp -n`'s, which stores nothing on disk; and `tsp`'s time per job is set
/// beside the least any command that waits for a durable commit could take: the start of
/// `/bin/true` and the commit.
fn fed_by_the_shell(cli: &std::path::Path) {
    let dir = tempfile::tempdir().expect("a temporary folder can be created");
    let parts = feed_parts(cli, dir.path());
    // The binary's start and exit, its own work and the round trip, without a commit; then
    // the runner's commit, from a hand-off in process without the round trip.
    let floor = parts.answered + parts.handed.saturating_sub(parts.round_trip);
    let ms = |d: Duration| format!("{:.3} ms", d.as_secs_f64() * 1000.0);
    let row = |label: &str, ours: Duration, base: Option<Duration>| {
        let (base_text, ratio) = base.map_or((String::new(), String::new()), |b| {
            (
                ms(b),
                format!("{:.2}", ours.as_secs_f64() / b.as_secs_f64()),
            )
        });
        println!("{label:<50} {:>18} {base_text:>18} {ratio:>7}", ms(ours));
    };
    row("exec of `/bin/true`", parts.exec_true, None);
    row("exec of `leasehold --version`", parts.exec_cli, None);
    row("part: `jobs add` answered at once", parts.answered, None);
    row("  of which the datagram round trip", parts.round_trip, None);
    let commit = parts.handed.saturating_sub(parts.round_trip);
    row("part: durable commit of a handed job", commit, None);
    row("floor: the two parts", floor, None);
    row(
        "`jobs add` in a loop, per call / the floor",
        parts.adds,
        Some(floor),
    );

    let path = dir.path().join("fed.db");
    let runner = leasehold::Runner::builder(&path)
        .workers(WORKERS)
        .start()
        .expect("the runner starts");
    let watch = Store::open(&path).expect("the bench database opens");
    let tsp = Tsp::start(dir.path());
    let per_round = FED_JOBS / FEED_ROUNDS;
    let (mut ours, mut theirs) = (Duration::ZERO, Duration::ZERO);
    for _ in 0..FEED_ROUNDS {
        let t = Instant::now();
        feed(cli, &path, per_round, &[]);
        while watch.has_unfinished(&[]).expect("the bench database reads") {
            std::thread::sleep(Duration::from_millis(2));
        }
        ours += t.elapsed();
        if let Some(tsp) = &tsp {
            theirs += tsp.feed(per_round);
        }
    }
    assert_eq!(watch.counts().expect("counts").succeeded, FED_JOBS as u64);
    runner.shutdown().expect("the runner shuts down");
    let tsp = tsp.map(|_| theirs);
    let rate = |d: Duration| FED_JOBS as f64 / d.as_secs_f64();
    println!(
        "{:<50} {:>18} {:>18} {:>7}",
        "2,000 `jobs add` into a runner / `tsp -n`",
        format!("{} jobs/s", thousands(rate(ours))),
        tsp.map_or("no tsp".to_string(), |d| format!(
            "{} jobs/s",
            thousands(rate(d))
        )),
        tsp.map_or(String::new(), |d| format!("{:.2}", rate(ours) / rate(d)))
    );
    row(
        "  the same, per job / the floor",
        ours / FED_JOBS as u32,
        Some(floor),
    );
    if let Some(tsp) = tsp {
        row(
            "  tsp's, per job / `/bin/true` + the commit",
            tsp / FED_JOBS as u32,
            Some(parts.exec_true + commit),
        );
    }
    println!(
        "  `sh -c true`, one call per job from one thread, first add to last ending, in \
         {FEED_ROUNDS} rounds alternating with tsp's; ratio = leasehold's jobs/s / tsp's. \
         Parts: the median of {FEED_ROUNDS} rounds, each the mean of {PART_CALLS} calls \
         (round trip: {ROUND_TRIPS}); answered at once: by a thread of the bench that \
         stores nothing; commit = in-process `Store::hand_off` - round trip; tsp commits \
         nothing to disk"
    );
}

/// How many interleaved rounds time the parts of a handed `jobs add`, and feed the runner
/// and task-spooler.
const FEED_ROUNDS: usize = 5;
/// How many calls each round times of each part.
const PART_CALLS: usize = 100;
/// How many datagram round trips are timed.
const ROUND_TRIPS: usize = 2000;

/// The parts of one handed `jobs add`, each a mean per call.
struct FeedParts {
    /// Spawning `/bin/true` and waiting for it: a small program's start and exit.
    exec_true: Duration,
    /// Spawning `leasehold --version` and waiting for it: this binary's start and exit.
    exec_cli: Duration,
    /// `leasehold jobs add` answered at once by a thread of the bench posing as a runner,
    /// which stores nothing: the binary's start and exit, its parse, the round trip.
    answered: Duration,
    /// A 353-byte request and a 70-byte answer between two Unix datagram sockets, one read
    /// by another thread (as a runner's listener reads its socket).
    round_trip: Duration,
    /// `Store::hand_off` of one job to a running runner, in process: the command's own work,
    /// the round trip and the runner's durable commit.
    handed: Duration,
    /// `leasehold jobs add` run to the end, one after another, its jobs stored and not run.
    adds: Duration,
}

/// Times each part of a handed `jobs add` on its own, in `dir`, and the whole calls, in
/// interleaved rounds; the median round of each.
fn feed_parts(cli: &std::path::Path, dir: &std::path::Path) -> FeedParts {
    let exec = |program: &std::path::Path, arg: &str| {
        let t = Instant::now();
        for _ in 0..PART_CALLS {
            let status = std::process::Command::new(program)
                .arg(arg)
                .stdout(std::process::Stdio::null())
                .status()
                .expect("the program runs");
            assert!(status.success());
        }
        t.elapsed() / PART_CALLS as u32
    };
    // A runner that serves another queue: the jobs handed to it are stored, never run.
    let path = dir.join("parts.db");
    let runner = leasehold::Runner::builder(&path)
        .workers(WORKERS)
        .queue("served", None)
        .start()
        .expect("the runner starts");
    let options = OpenOptions::new().checkpoint_on_close(false);
    let job = Job::command(["sh", "-c", "true"]).queue("unserved");
    let mut rounds: [Vec<Duration>; 5] = Default::default();
    for _ in 0..FEED_ROUNDS {
        rounds[0].push(exec(std::path::Path::new("/bin/true"), "--version"));
        rounds[1].push(exec(cli, "--version"));
        let t = Instant::now();
        for _ in 0..PART_CALLS {
            Store::hand_off(&path, &options, &job).expect("the job is handed over");
        }
        rounds[2].push(t.elapsed() / PART_CALLS as u32);
        let answerer = Answerer::start(dir);
        let t = Instant::now();
        feed(cli, &answerer.db, PART_CALLS, &[]);
        rounds[3].push(t.elapsed() / PART_CALLS as u32);
        answerer.stop();
        let t = Instant::now();
        feed(cli, &path, PART_CALLS, &["--queue", "unserved"]);
        rounds[4].push(t.elapsed() / PART_CALLS as u32);
    }
    runner.shutdown().expect("the runner shuts down");
    let [exec_true, exec_cli, handed, answered, adds] = rounds.map(|mut r| {
        r.sort_unstable();
        r[r.len() / 2]
    });
    FeedParts {
        exec_true,
        exec_cli,
        answered,
        round_trip: datagram_round_trip(dir),
        handed,
        adds,
    }
}

/// The mean round trip of a request the size of a handed job's and an answer the size of a
/// runner's, between a socket bound in `dir` and read by another thread and an abstract one
/// (as `jobs add` binds).
fn datagram_round_trip(dir: &std::path::Path) -> Duration {
    use std::os::linux::net::SocketAddrExt;
    use std::os::unix::net::{SocketAddr, UnixDatagram};
    let server_path = dir.join("echo.sock");
    let server = UnixDatagram::bind(&server_path).expect("the echo socket binds");
    let echo = std::thread::spawn(move || {
        let mut buf = [0u8; 1024];
        for _ in 0..ROUND_TRIPS {
            let (_, from) = server.recv_from(&mut buf).expect("a request");
            server
                .send_to_addr(&[b'a'; 70], &from)
                .expect("the answer is sent");
        }
    });
    let name = format!("leasehold-bench-{}", std::process::id());
    let client = SocketAddr::from_abstract_name(name)
        .and_then(|addr| UnixDatagram::bind_addr(&addr))
        .expect("the client socket binds");
    let mut buf = [0u8; 512];
    let t = Instant::now();
    for _ in 0..ROUND_TRIPS {
        client
            .send_to(&[b'r'; 353], &server_path)
            .expect("the request is sent");
        client.recv(&mut buf).expect("the answer comes");
    }
    let took = t.elapsed() / ROUND_TRIPS as u32;
    echo.join().expect("the echo thread does not panic");
    took
}

/// A thread posing as a runner on a database that does not exist: a socket in the file's
/// wake-up folder that answers every handed job at once as stored (id 1), storing nothing.
struct Answerer {
    /// The database the `jobs add` calls name.
    db: std::path::PathBuf,
    /// The socket the thread answers from.
    socket: std::path::PathBuf,
    /// The thread, which ends at the first datagram that is not a request.
    thread: std::thread::JoinHandle<()>,
}

impl Answerer {
    /// Makes the wake-up folder of `answered.db` in `dir` (owner-only, as a runner makes it),
    /// binds the socket in it and starts the thread that answers.
    fn start(dir: &std::path::Path) -> Answerer {
        use std::os::unix::fs::DirBuilderExt;
        use std::os::unix::net::UnixDatagram;
        let dir = std::fs::canonicalize(dir).expect("the bench folder resolves");
        let db = dir.join("answered.db");
        let folder = dir.join("answered.db-wake");
        std::fs::DirBuilder::new()
            .mode(0o700)
            .create(&folder)
            .expect("the wake-up folder is made");
        let socket = folder.join("1-bench.sock");
        let listener = UnixDatagram::bind(&socket).expect("the socket binds");
        let thread = std::thread::spawn(move || {
            let mut buf = vec![0u8; 65536];
            loop {
                let (n, from) = listener.recv_from(&mut buf).expect("a datagram");
                if buf[..n].first() != Some(&b'{') {
                    break;
                }
                let request: serde_json::Value =
                    serde_json::from_slice(&buf[..n]).expect("a request is JSON");
                let answer = serde_json::json!({
                    "token": request["token"], "id": 1, "duplicate": false
                });
                listener
                    .send_to_addr(answer.to_string().as_bytes(), &from)
                    .expect("the answer is sent");
            }
        });
        Answerer { db, socket, thread }
    }

    /// Ends the thread and removes its folder.
    fn stop(self) {
        let poke = std::os::unix::net::UnixDatagram::unbound().expect("a socket");
        poke.send_to(&[0], &self.socket).expect("the stop is sent");
        self.thread
            .join()
            .expect("the answering thread does not panic");
        let folder = self.socket.parent().expect("the socket is in a folder");
        std::fs::remove_dir_all(folder).expect("the folder is removed");
    }
}

/// Runs `leasehold --db PATH jobs add ARGS -- sh -c true` `n` times, one after another, as a
/// shell loop would.
fn feed(cli: &std::path::Path, path: &std::path::Path, n: usize, args: &[&str]) {
    for _ in 0..n {
        let status = std::process::Command::new(cli)
            .arg("--db")
            .arg(path)
            .args(["jobs", "add"])
            .args(args)
            .args(["--", "sh", "-c", "true"])
            .stdout(std::process::Stdio::null())
            .status()
            .expect("leasehold jobs add runs");
        assert!(status.success());
    }
}

/// task-spooler with its own server (4 slots) in a folder of the bench's.
struct Tsp {
    /// `tsp` (Debian's name: moreutils has a `ts`) or `ts` (task-spooler's own name).
    program: &'static str,
    /// Where its socket, its list and its jobs' output go.
    dir: std::path::PathBuf,
}

impl Tsp {
    /// Starts task-spooler's server in `dir` with 4 slots; None (with a note) when neither
    /// `tsp` nor `ts` on the PATH is task-spooler.
    fn start(dir: &std::path::Path) -> Option<Tsp> {
        let program = ["tsp", "ts"].into_iter().find(|name| {
            std::process::Command::new(name)
                .arg("-V")
                .output()
                .is_ok_and(|out| {
                    let text = [out.stdout, out.stderr].concat();
                    String::from_utf8_lossy(&text)
                        .to_lowercase()
                        .contains("task spooler")
                })
        });
        let Some(program) = program else {
            println!("(task-spooler not found as `tsp` or `ts`: install it for its baseline)");
            return None;
        };
        let tsp = Tsp {
            program,
            dir: dir.to_path_buf(),
        };
        tsp.run(&["-S", "4"]);
        Some(tsp)
    }

    /// Runs task-spooler with `args` against this server; panics unless it succeeds.
    fn run(&self, args: &[&str]) -> std::process::Output {
        let out = std::process::Command::new(self.program)
            .args(args)
            .env("TS_SOCKET", self.dir.join("tsp.socket"))
            .env("TS_SAVELIST", self.dir.join("tsp.list"))
            .env("TMPDIR", &self.dir)
            .output()
            .expect("task-spooler runs");
        assert!(out.status.success(), "{out:?}");
        out
    }

    /// `tsp -n sh -c true` `n` times, one after another, first add to last ending.
    fn feed(&self, n: usize) -> Duration {
        let t = Instant::now();
        for _ in 0..n {
            self.run(&["-n", "sh", "-c", "true"]);
        }
        loop {
            let out = self.run(&["-l"]);
            let list = String::from_utf8_lossy(&out.stdout);
            if !list.contains("running") && !list.contains("queued") {
                break;
            }
            std::thread::sleep(Duration::from_millis(2));
        }
        t.elapsed()
    }
}

impl Drop for Tsp {
    /// Ends task-spooler's server.
    fn drop(&mut self) {
        let _ = std::process::Command::new(self.program)
            .arg("-K")
            .env("TS_SOCKET", self.dir.join("tsp.socket"))
            .output();
    }
}
