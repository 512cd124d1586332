//! The `postgres` section: leasehold on PostgreSQL beside leasehold on SQLite and beside the
//! server's own ceiling, `pgbench`, in one run (issue 23's *Measure*).
//!
//! ```text
//! LEASEHOLD_BENCH_PG=postgres://postgres@127.0.0.1:55401/postgres \
//!     cargo run --release --example bench -- postgres [cycles|e2e|latency|profile]
//! ```
//!
//! The URL names a server on this host and a role that may create databases: the bench makes
//! `leasehold_bench` (fresh for each measurement) and `leasehold_bench_pgbench` beside the
//! URL's database, and drops both at the end. SQLite runs on a file in a temporary folder on
//! this machine's disk (`/tmp`), durability FULL (the default), as PostgreSQL keeps `fsync` and
//! `synchronous_commit` on.
//!
//! Every "process" here is a process: the bench runs itself again as each child
//! (`bench __cycles ...`, `bench __runner ...`), each with its own `Store` or `Runner`.

use std::io::{BufRead, BufReader, Write};
use std::process::{Child, ChildStdin, ChildStdout, Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use leasehold::protocol::{ClaimRequest, Ending, Finish, Finished};
use leasehold::{Job, Runner, Store, now_ms};
use postgres::{Client, NoTls};
use tempfile::TempDir;

use super::{quantile, thousands};

/// The environment variable that holds the benchmark server's URL.
pub const PG_ENV: &str = "LEASEHOLD_BENCH_PG";
/// Seconds each timed run of cycles and of pgbench lasts; `LEASEHOLD_BENCH_SECS` changes it.
const DEFAULT_SECS: f64 = 5.0;
/// The numbers of processes (runner processes, pgbench clients) compared;
/// `LEASEHOLD_BENCH_PROCS=16` (or `1,16`, ...) runs only those.
const PROCS: [usize; 3] = [1, 4, 16];
/// Rounds of the cycles and end-to-end tables; their figures are the medians.
/// `LEASEHOLD_BENCH_ROUNDS` changes it.
const ROUNDS: usize = 3;
/// Jobs ready before a timed run of cycles: more than any run here claims, so that none runs
/// dry (a run that does is marked, and its rate is then that of the drain).
const CYCLE_JOBS: usize = 20_000;
/// Jobs ready for the batched bare client's run.
const BATCH_JOBS: usize = 100_000;
/// Jobs of `/bin/true` a run of the end-to-end table runs (issue 32's "the same jobs": 3,000).
const E2E_JOBS: usize = 3_000;
/// Jobs the enqueue-to-start latency is taken over, one at a time; fewer for the poll alone.
const LATENCY_JOBS: usize = 100;
const POLL_LATENCY_JOBS: usize = 30;
/// The database each measurement gets afresh, and pgbench's.
const BENCH_DB: &str = "leasehold_bench";
const PGBENCH_DB: &str = "leasehold_bench_pgbench";
/// River's published figure: `river bench -n 1_000_000` burning down a million no-op jobs
/// (workers in the Go process, batched fetches and completions) on an M2 MacBook Air (8
/// cores), PostgreSQL on the same machine; riverqueue/river PR #258 and issue #278, March
/// 2024. A reference, not a measurement of ours.
const RIVER_JOBS_PER_SEC: f64 = 46_000.0;

// ---------------------------------------------------------------------------------------------
// The section

/// Which backend a measurement runs on.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Backend {
    Postgres,
    Sqlite,
}

/// The server under test: its URL and what the bench derives from it.
struct Server {
    /// The URL as given (`LEASEHOLD_BENCH_PG`).
    url: String,
    /// Seconds a timed run lasts.
    secs: f64,
    /// The numbers of processes compared.
    procs: Vec<usize>,
    /// Rounds of the cycles and end-to-end tables.
    rounds: usize,
}

impl Server {
    /// The URL of database `name` on this server.
    fn db_url(&self, name: &str) -> String {
        with_database(&self.url, name)
    }

    /// A new connection to the URL's own database, for creating and dropping the bench's.
    fn admin(&self) -> Client {
        Client::connect(&self.url, NoTls).unwrap_or_else(|e| {
            panic!(
                "cannot connect to the benchmark server at {} ({PG_ENV}): {e}",
                self.url
            )
        })
    }

    /// Database `name`, dropped (with whatever is connected to it) and made anew.
    fn fresh(&self, name: &str) -> String {
        let mut admin = self.admin();
        // Two calls: CREATE DATABASE cannot run in the implicit transaction of a batch.
        admin
            .batch_execute(&format!("DROP DATABASE IF EXISTS {name} WITH (FORCE)"))
            .and_then(|()| admin.batch_execute(&format!("CREATE DATABASE {name}")))
            .unwrap_or_else(|e| {
                panic!("cannot make the database {name} on {} (the role must be allowed to create databases): {e}", self.url)
            });
        self.db_url(name)
    }

    fn drop_db(&self, name: &str) {
        let _ = self
            .admin()
            .batch_execute(&format!("DROP DATABASE IF EXISTS {name} WITH (FORCE)"));
    }
}

/// Where one measurement's jobs live: a fresh PostgreSQL database, or a new SQLite file.
struct Target {
    backend: Backend,
    /// The URL or the file's path, as `Store::open` and the children take it.
    db: String,
    /// The SQLite file's folder, removed with this.
    _dir: Option<TempDir>,
}

impl Target {
    fn fresh(server: &Server, backend: Backend) -> Target {
        match backend {
            Backend::Postgres => {
                let db = server.fresh(BENCH_DB);
                amend_schema(&db);
                Target {
                    backend,
                    db,
                    _dir: None,
                }
            }
            Backend::Sqlite => {
                let dir = tempfile::tempdir().expect("a temporary folder can be created");
                Target {
                    backend,
                    db: dir.path().join("bench.db").to_string_lossy().into_owned(),
                    _dir: Some(dir),
                }
            }
        }
    }
}

/// The environment variable naming a SQL file run on each fresh PostgreSQL database once the
/// store made its schema: a variant of the schema measured without a build of its own.
const PG_SQL_ENV: &str = "LEASEHOLD_BENCH_PG_SQL";

/// Makes the store's schema in `db` and runs [`PG_SQL_ENV`]'s file on it, when one is named.
fn amend_schema(db: &str) {
    let Ok(path) = std::env::var(PG_SQL_ENV) else {
        return;
    };
    drop(Store::open(db).expect("the bench database opens"));
    let text = std::fs::read_to_string(&path)
        .unwrap_or_else(|e| panic!("cannot read {PG_SQL_ENV} ({path}): {e}"));
    Client::connect(db, NoTls)
        .and_then(|mut c| c.batch_execute(&text))
        .unwrap_or_else(|e| panic!("{PG_SQL_ENV} ({path}) fails: {e}"));
}

/// The updates of `jobs` in `db` so far, and how many of them were HOT.
fn hot_updates(db: &str) -> Option<(i64, i64)> {
    let mut c = Client::connect(db, NoTls).ok()?;
    c.query_one(
        "SELECT n_tup_upd, n_tup_hot_upd FROM pg_stat_user_tables
         WHERE relname = 'jobs' AND schemaname = current_schema()",
        &[],
    )
    .ok()
    .map(|r| (r.get(0), r.get(1)))
}

/// The share of the updates between two readings of [`hot_updates`] that were HOT.
fn hot_share(before: Option<(i64, i64)>, after: Option<(i64, i64)>) -> Option<f64> {
    let ((u0, h0), (u1, h1)) = before.zip(after)?;
    (u1 > u0).then(|| (h1 - h0) as f64 / (u1 - u0) as f64)
}

/// `bench postgres [part]`: every part, or the one named.
pub fn postgres_benchmarks() {
    let url = match std::env::var(PG_ENV) {
        Ok(url) if !url.trim().is_empty() => url.trim().to_string(),
        _ => {
            eprintln!(
                "bench postgres: {PG_ENV} is not set. It needs the URL of a PostgreSQL server on \
                 this host whose role may create databases, e.g.\n  \
                 LEASEHOLD_PG_PORT=55401 LEASEHOLD_PG_DIR=/tmp/bench-pg bash .ci/pg start\n  \
                 {PG_ENV}=postgres://postgres@127.0.0.1:55401/postgres cargo run --release \
                 --example bench -- postgres\n(and `.ci/pg stop` with the same variables after)"
            );
            std::process::exit(2);
        }
    };
    let secs = std::env::var("LEASEHOLD_BENCH_SECS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(DEFAULT_SECS);
    let procs = std::env::var("LEASEHOLD_BENCH_PROCS")
        .ok()
        .map(|s| {
            s.split(',')
                .filter_map(|n| n.trim().parse().ok())
                .collect::<Vec<usize>>()
        })
        .filter(|v| !v.is_empty())
        .unwrap_or_else(|| PROCS.to_vec());
    let rounds = std::env::var("LEASEHOLD_BENCH_ROUNDS")
        .ok()
        .and_then(|s| s.parse().ok())
        .filter(|&n| n > 0)
        .unwrap_or(ROUNDS);
    let server = Server {
        url,
        secs,
        procs,
        rounds,
    };
    let part = std::env::args().nth(2);
    let parts = ["cycles", "e2e", "latency", "profile"];
    if let Some(p) = part.as_deref()
        && !parts.contains(&p)
    {
        eprintln!("usage: bench postgres [{}]", parts.join("|"));
        std::process::exit(2);
    }
    let runs = |name: &str| part.is_none() || part.as_deref() == Some(name);
    describe_server(&server);
    let mut pgbench = (None, None);
    if runs("cycles") {
        pgbench = cycles_table(&server);
    }
    if runs("e2e") {
        e2e_table(&server);
    }
    if runs("latency") {
        latency_table(&server);
    }
    if runs("profile") {
        profile(&server, pgbench);
    }
    server.drop_db(BENCH_DB);
    server.drop_db(PGBENCH_DB);
}

/// The server's version and settings that decide a commit's cost, and the machine's load.
fn describe_server(server: &Server) {
    let mut admin = server.admin();
    let show = |admin: &mut Client, what: &str| -> String {
        admin
            .query_one(&format!("SHOW {what}"), &[])
            .and_then(|r| r.try_get::<_, String>(0))
            .unwrap_or_else(|_| "?".into())
    };
    let version = show(&mut admin, "server_version");
    let fsync = show(&mut admin, "fsync");
    let sync = show(&mut admin, "synchronous_commit");
    let preload = show(&mut admin, "shared_preload_libraries");
    let load = std::fs::read_to_string("/proc/loadavg").unwrap_or_default();
    let load: Vec<&str> = load.split_whitespace().take(3).collect();
    println!();
    println!(
        "postgres: PostgreSQL {version} at {} (fsync {fsync}, synchronous_commit {sync}, \
         shared_preload_libraries '{preload}'); SQLite FULL on a file in {}; {} cores, load {}; \
         {:.0} s a timed run",
        redact(&server.url),
        std::env::temp_dir().display(),
        cores(),
        load.join(" "),
        server.secs
    );
}

fn cores() -> usize {
    std::thread::available_parallelism().map_or(1, |n| n.get())
}

// ---------------------------------------------------------------------------------------------
// Claim + finish cycles, beside pgbench

/// What one timed run of cycles gave.
#[derive(Clone, Copy, Debug, Default)]
struct Cycles {
    /// Cycles a second over all processes.
    rate: f64,
    /// Mean wall time of one claim and of one finish in a process, ms.
    claim_ms: f64,
    finish_ms: f64,
    /// The processes' own CPU (user + system) a cycle, ms.
    client_cpu_ms: f64,
    /// The server's backends' CPU a cycle, ms (PostgreSQL, when /proc shows them).
    server_cpu_ms: Option<f64>,
    /// Whether a process found no job before its time was up.
    dry: bool,
    /// The WAL the server wrote a cycle, bytes (PostgreSQL; the whole cluster's, from
    /// `pg_stat_wal`, so only on a server of the bench's own).
    wal_bytes: Option<f64>,
    /// The WAL flushes (`pg_stat_wal.wal_sync`) a cycle, the whole cluster's.
    wal_syncs: Option<f64>,
    /// The share of the run's updates of `jobs` that were HOT (`pg_stat_user_tables`).
    hot: Option<f64>,
}

/// One row's runs in one round of the cycles table.
#[derive(Clone, Copy, Default)]
struct CycleRuns {
    pgbench: Option<f64>,
    /// The WAL pgbench wrote a transaction, bytes.
    pgbench_wal: Option<f64>,
    pg: Cycles,
    /// leasehold's Store, [`BATCH`] jobs a claim and a `finish_many` of them (a cycle: one job).
    batch: Cycles,
    bare: Cycles,
    lite: Cycles,
}

/// Claim+finish cycles a second with 1, 4 and 16 processes on PostgreSQL and on SQLite, beside
/// pgbench's one-row updates at as many clients on the same server and beside a bare client
/// that does each transition in one statement ([`BARE_CLAIM`], [`BARE_FINISH`]), in
/// [`ROUNDS`] rounds whose runs take turns; medians of the rounds, ratios taken within each
/// round. Returns pgbench's median rates at 1 and at 16 clients.
fn cycles_table(server: &Server) -> (Option<f64>, Option<f64>) {
    let n_rounds = server.rounds;
    let pgbench = Pgbench::setup(server);
    println!();
    println!(
        "claim + finish cycles, no job process: each process its own Store (its own connection), \
         claiming one job and recording its success, in turn, for {:.0} s",
        server.secs
    );
    let mut rounds: Vec<Vec<CycleRuns>> = Vec::new();
    for round in 0..server.rounds {
        let mut row = Vec::new();
        for &procs in &server.procs {
            let mut r = CycleRuns::default();
            // A rotating order, so that no kind of run always comes first or after another.
            for k in 0..5 {
                match (round + k) % 5 {
                    0 => {
                        let run = pgbench.as_ref().and_then(|p| p.run(server, procs));
                        r.pgbench = run.map(|(tps, _)| tps);
                        r.pgbench_wal = run.and_then(|(_, wal)| wal);
                    }
                    1 => r.pg = cycles(server, Backend::Postgres, procs),
                    2 => r.bare = cycles_of(server, Backend::Postgres, procs, "__bare_cycles"),
                    3 => r.batch = cycles_of(server, Backend::Postgres, procs, "__batch_cycles"),
                    _ => r.lite = cycles(server, Backend::Sqlite, procs),
                }
            }
            let dry = |c: &Cycles| if c.dry { " (ran dry)" } else { "" };
            eprintln!(
                "  round {} / {n_rounds}, {procs:>2} processes: pgbench {} tps, PostgreSQL {} cycles/s{}, x{BATCH} {}{}, bare {}{}, SQLite {}{}",
                round + 1,
                r.pgbench.map_or("-".into(), thousands),
                thousands(r.pg.rate),
                dry(&r.pg),
                thousands(r.batch.rate),
                dry(&r.batch),
                thousands(r.bare.rate),
                dry(&r.bare),
                thousands(r.lite.rate),
                dry(&r.lite),
            );
            row.push(r);
        }
        rounds.push(row);
    }
    println!(
        "{:<10} {:>12} {:>12} {:>12} {:>12} {:>9} {:>9} {:>9}",
        "processes",
        "PostgreSQL",
        "SQLite FULL",
        "pgbench",
        "bare PG",
        "PG/pgb.",
        "bare/pgb.",
        "PG/SQLite"
    );
    println!(
        "{:<10} {:>12} {:>12} {:>12} {:>12}",
        "", "cycles/s", "cycles/s", "updates/s", "cycles/s"
    );
    println!("{}", "-".repeat(92));
    let (mut pgbench_1, mut pgbench_16) = (None, None);
    for (i, &procs) in server.procs.iter().enumerate() {
        let runs: Vec<CycleRuns> = rounds.iter().map(|r| r[i]).collect();
        let rate = |f: fn(&CycleRuns) -> &Cycles| mid(runs.iter().map(|r| f(r).rate).collect());
        let tps: Vec<f64> = runs.iter().filter_map(|r| r.pgbench).collect();
        let tps_mid = (!tps.is_empty()).then(|| mid(tps));
        if procs == 1 {
            pgbench_1 = tps_mid;
        }
        if procs == 16 {
            pgbench_16 = tps_mid;
        }
        let to_pgbench = |f: fn(&CycleRuns) -> &Cycles| -> Vec<f64> {
            runs.iter()
                .filter_map(|r| r.pgbench.map(|t| f(r).rate / t))
                .collect()
        };
        let pg_pgb = to_pgbench(|r| &r.pg);
        let batch_pgb = to_pgbench(|r| &r.batch);
        let bare_pgb = to_pgbench(|r| &r.bare);
        let pg_lite: Vec<f64> = runs.iter().map(|r| r.pg.rate / r.lite.rate).collect();
        let shown = |v: &[f64]| {
            if v.is_empty() {
                "-".to_string()
            } else {
                format!("{:.2}", mid(v.to_vec()))
            }
        };
        let dry = runs.iter().any(|r| r.pg.dry || r.bare.dry || r.lite.dry);
        println!(
            "{:<10} {:>12} {:>12} {:>12} {:>12} {:>9} {:>9} {:>9}{}",
            procs,
            thousands(rate(|r| &r.pg)),
            thousands(rate(|r| &r.lite)),
            tps_mid.map_or("-".into(), thousands),
            thousands(rate(|r| &r.bare)),
            shown(&pg_pgb),
            shown(&bare_pgb),
            shown(&pg_lite),
            if dry { "  (a run ran dry)" } else { "" }
        );
        println!(
            "  Store, {BATCH} jobs a claim and a finish_many: {} cycles/s, {} of pgbench (in each round: {}); CPU a cycle {:.3} + {} ms; WAL a cycle {} B",
            thousands(rate(|r| &r.batch)),
            shown(&batch_pgb),
            listed(&batch_pgb),
            mid(runs.iter().map(|r| r.batch.client_cpu_ms).collect()),
            {
                let v: Vec<f64> = runs.iter().filter_map(|r| r.batch.server_cpu_ms).collect();
                if v.is_empty() {
                    "?".to_string()
                } else {
                    format!("{:.3}", mid(v))
                }
            },
            {
                let v: Vec<f64> = runs.iter().filter_map(|r| r.batch.wal_bytes).collect();
                if v.is_empty() {
                    "?".to_string()
                } else {
                    thousands(mid(v))
                }
            },
        );
        let median_of = |v: Vec<f64>, digits: usize| {
            if v.is_empty() {
                "?".to_string()
            } else {
                format!("{:.*}", digits, mid(v))
            }
        };
        println!(
            "  WAL flushes a cycle: Store x{BATCH} {}, PostgreSQL {}; HOT updates of jobs: Store x{BATCH} {}, PostgreSQL {}",
            median_of(runs.iter().filter_map(|r| r.batch.wal_syncs).collect(), 3),
            median_of(runs.iter().filter_map(|r| r.pg.wal_syncs).collect(), 3),
            median_of(runs.iter().filter_map(|r| r.batch.hot).collect(), 2),
            median_of(runs.iter().filter_map(|r| r.pg.hot).collect(), 2),
        );
        println!(
            "  in each round: PG/pgbench {}; bare/pgbench {}; PG/SQLite {}",
            listed(&pg_pgb),
            listed(&bare_pgb),
            listed(&pg_lite)
        );
        let ms = |f: fn(&CycleRuns) -> &Cycles| {
            format!(
                "{:.2} + {:.2} ms",
                mid(runs.iter().map(|r| f(r).claim_ms).collect()),
                mid(runs.iter().map(|r| f(r).finish_ms).collect())
            )
        };
        println!(
            "  claim + finish in a process: PostgreSQL {}, bare {}, SQLite {}",
            ms(|r| &r.pg),
            ms(|r| &r.bare),
            ms(|r| &r.lite)
        );
        let server_cpu = |f: fn(&CycleRuns) -> &Cycles| {
            let v: Vec<f64> = runs.iter().filter_map(|r| f(r).server_cpu_ms).collect();
            if v.is_empty() {
                "?".to_string()
            } else {
                format!("{:.3}", mid(v))
            }
        };
        println!(
            "  CPU a cycle, processes + server's backends: PostgreSQL {:.3} + {} ms, bare {:.3} + {} ms; SQLite {:.3} ms",
            mid(runs.iter().map(|r| r.pg.client_cpu_ms).collect()),
            server_cpu(|r| &r.pg),
            mid(runs.iter().map(|r| r.bare.client_cpu_ms).collect()),
            server_cpu(|r| &r.bare),
            mid(runs.iter().map(|r| r.lite.client_cpu_ms).collect()),
        );
        let wal = |v: Vec<f64>| {
            if v.is_empty() {
                "?".to_string()
            } else {
                thousands(mid(v))
            }
        };
        println!(
            "  WAL a cycle: PostgreSQL {} B, bare {} B; pgbench {} B a transaction",
            wal(runs.iter().filter_map(|r| r.pg.wal_bytes).collect()),
            wal(runs.iter().filter_map(|r| r.bare.wal_bytes).collect()),
            wal(runs.iter().filter_map(|r| r.pgbench_wal).collect()),
        );
    }
    println!(
        "{n_rounds} rounds, each every run of every row in a rotating order; rates are the medians \
         of the rounds, ratios the medians of each round's ratio. pgbench: `-M prepared`, one \
         `UPDATE t SET n = n + 1 WHERE id = :id` (1,000 rows) a transaction, -j min(clients, \
         cores). bare PG: a plain client on leasehold's schema (its triggers, its event rows), \
         each transition one autocommitted statement (no counters, no histograms). CPU: each \
         process's getrusage; the backends' from /proc/PID/stat, 10 ms ticks."
    );
    let last = server.procs.len() - 1;
    let goal: Vec<f64> = rounds
        .iter()
        .filter(|_| server.procs[last] == 16)
        .filter_map(|r| {
            r[last]
                .pgbench
                .map(|t| r[last].pg.rate.max(r[last].batch.rate) / t)
        })
        .collect();
    if !goal.is_empty() {
        let g = mid(goal);
        println!(
            "goal (issues 23, 32): at 16 processes, PostgreSQL cycles (one a claim, or {BATCH}) >= 0.5 x pgbench's rate: {g:.2} ({})",
            if g >= 0.5 { "met" } else { "missed" }
        );
    }
    println!(
        "reference, not measured here: River's published {} jobs/s (8-core M2 MacBook Air, \
         no-op jobs in its own process, batched fetches and completions; riverqueue/river#258)",
        thousands(RIVER_JOBS_PER_SEC)
    );
    (pgbench_1, pgbench_16)
}

/// One timed run of cycles: `procs` children on a fresh `backend` database with
/// [`CYCLE_JOBS`] ready jobs, started together, each claiming and finishing for `secs`.
fn cycles(server: &Server, backend: Backend, procs: usize) -> Cycles {
    cycles_of(server, backend, procs, "__cycles")
}

/// As [`cycles`], with children that run `child` (`__cycles`, or `__bare_cycles` on
/// PostgreSQL).
fn cycles_of(server: &Server, backend: Backend, procs: usize, child: &str) -> Cycles {
    let target = Target::fresh(server, backend);
    let jobs = if child == "__batch_cycles" {
        BATCH_JOBS
    } else {
        CYCLE_JOBS
    };
    fill(&target, jobs);
    let mut kids = Kids::spawn(procs, |i| {
        let mut cmd = self_command();
        cmd.args([
            child,
            &target.db,
            &server.secs.to_string(),
            &format!("bench-{i}"),
        ]);
        cmd
    });
    kids.await_ready();
    let backends = match backend {
        Backend::Postgres => backend_pids(server),
        Backend::Sqlite => Vec::new(),
    };
    let wal_before = (backend == Backend::Postgres)
        .then(|| wal_stats(server))
        .flatten();
    let hot_before = (backend == Backend::Postgres)
        .then(|| hot_updates(&target.db))
        .flatten();
    let before = cpu_ticks(&backends);
    let results = kids.go();
    let after = cpu_ticks(&backends);
    kids.stop();
    let mut cycles = summarize(&results, before.zip(after));
    if let Some((b, s)) = wal_before {
        let n = results.iter().map(|r| r.cycles).sum::<u64>().max(1) as f64;
        let after = wal_stats(server);
        cycles.wal_bytes = after.map(|(a, _)| (a - b) as f64 / n);
        cycles.wal_syncs = after.map(|(_, a)| (a - s) as f64 / n);
        cycles.hot = hot_share(hot_before, hot_updates(&target.db));
    }
    cycles
}

/// The WAL the server has written, bytes, once the backends that ended have reported it
/// (`pg_stat_wal`; a backend reports at exit and at most once a second while it runs).
fn wal_bytes(server: &Server) -> Option<i64> {
    wal_stats(server).map(|(bytes, _)| bytes)
}

/// As [`wal_bytes`], with the WAL flushes (`wal_sync`) so far.
fn wal_stats(server: &Server) -> Option<(i64, i64)> {
    std::thread::sleep(Duration::from_millis(1100));
    server
        .admin()
        .query_one(
            "SELECT wal_bytes::bigint, wal_sync::bigint FROM pg_stat_wal",
            &[],
        )
        .ok()
        .map(|r| (r.get(0), r.get(1)))
}

/// The children's reports as one figure: cycles over the longest of their times.
fn summarize(results: &[ChildReport], ticks: Option<(u64, u64)>) -> Cycles {
    let n: u64 = results.iter().map(|r| r.cycles).sum();
    let longest = results.iter().map(|r| r.elapsed).max().unwrap_or_default();
    let per = |total: Duration| total.as_secs_f64() * 1000.0 / n.max(1) as f64;
    let claim: Duration = results.iter().map(|r| r.claim).sum();
    let finish: Duration = results.iter().map(|r| r.finish).sum();
    let cpu: Duration = results.iter().map(|r| r.cpu).sum();
    let tick = 1000.0 / clock_ticks_per_sec() as f64;
    Cycles {
        rate: n as f64 / longest.as_secs_f64(),
        claim_ms: per(claim),
        finish_ms: per(finish),
        client_cpu_ms: per(cpu),
        server_cpu_ms: ticks.map(|(b, a)| a.saturating_sub(b) as f64 * tick / n.max(1) as f64),
        dry: results.iter().any(|r| r.dry),
        wal_bytes: None,
        wal_syncs: None,
        hot: None,
    }
}

/// Enqueues `n` jobs of `true` into `target` (a multiple of 1,000), then (on PostgreSQL)
/// analyses the table, as autovacuum would have on a database in use. On PostgreSQL the
/// first 1,000 go through `enqueue_many` and the rest are copies of their rows made in SQL
/// (the count triggers count them): enqueue's own speed is not what is measured here.
fn fill(target: &Target, n: usize) {
    let store = Store::open(&target.db).expect("the bench database opens");
    let jobs = vec![Job::command(["true"]); 1000];
    let through_store = match target.backend {
        Backend::Postgres => 1,
        Backend::Sqlite => n / 1000,
    };
    for _ in 0..through_store {
        store.enqueue_many(&jobs).expect("the jobs are enqueued");
    }
    drop(store);
    if target.backend == Backend::Postgres {
        let mut c = Client::connect(&target.db, NoTls).expect("the bench database connects");
        let columns: String = c
            .query_one(
                "SELECT string_agg(quote_ident(column_name), ', ' ORDER BY ordinal_position)
                 FROM information_schema.columns
                 WHERE table_schema = current_schema() AND table_name = 'jobs'
                   AND column_name <> 'id'",
                &[],
            )
            .expect("the jobs table's columns")
            .get(0);
        let copies = i64::try_from(n / 1000).unwrap_or(1) - 1;
        // The copies without the count triggers (row by row, they took minutes for 100,000
        // jobs on a loaded machine), then counted at once in shard 0.
        let mut tx = c.transaction().expect("a transaction");
        tx.batch_execute("SET LOCAL session_replication_role = replica")
            .expect("the role may skip triggers");
        tx.execute(
            &format!(
                "INSERT INTO jobs ({columns}) SELECT {columns} FROM jobs, generate_series(1, $1::bigint)"
            ),
            &[&copies],
        )
        .expect("the jobs are copied");
        tx.execute(
            "INSERT INTO job_count_shards AS c (queue, status, shard, n)
             VALUES ('default', 'pending', 0, $1::bigint * 1000)
             ON CONFLICT (queue, status, shard) DO UPDATE SET n = c.n + excluded.n",
            &[&copies],
        )
        .expect("the copies are counted");
        tx.commit().expect("the copies commit");
        c.batch_execute("VACUUM ANALYZE").expect("VACUUM ANALYZE");
    }
}

/// The PIDs of the server's backends connected to the bench's database (the children's).
fn backend_pids(server: &Server) -> Vec<i32> {
    server
        .admin()
        .query(
            "SELECT pid FROM pg_stat_activity WHERE datname = $1 AND backend_type = 'client backend'",
            &[&BENCH_DB],
        )
        .map(|rows| rows.iter().map(|r| r.get::<_, i32>(0)).collect())
        .unwrap_or_default()
}

/// The CPU ticks (user + system) of `pids` so far, from `/proc/PID/stat`; None when any cannot
/// be read (the server on another host, or no `/proc`).
fn cpu_ticks(pids: &[i32]) -> Option<u64> {
    if pids.is_empty() {
        return None;
    }
    let mut total = 0;
    for pid in pids {
        let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
        // After the command's name in parentheses: state is field 3, utime 14, stime 15.
        let rest = &stat[stat.rfind(')')? + 2..];
        let fields: Vec<&str> = rest.split_whitespace().collect();
        let utime: u64 = fields.get(11)?.parse().ok()?;
        let stime: u64 = fields.get(12)?.parse().ok()?;
        total += utime + stime;
    }
    Some(total)
}

fn clock_ticks_per_sec() -> u64 {
    nix::unistd::sysconf(nix::unistd::SysconfVar::CLK_TCK)
        .ok()
        .flatten()
        .map_or(100, |t| t as u64)
}

/// pgbench against the same server: a database of its own with 1,000 one-row targets.
struct Pgbench {
    url: String,
    script: tempfile::NamedTempFile,
}

impl Pgbench {
    /// Makes pgbench's database and script; None (with a note) when pgbench is not installed.
    fn setup(server: &Server) -> Option<Pgbench> {
        if Command::new("pgbench").arg("--version").output().is_err() {
            println!("(pgbench not found on the PATH: the server's ceiling is not measured)");
            return None;
        }
        let url = server.fresh(PGBENCH_DB);
        let mut c = Client::connect(&url, NoTls).expect("pgbench's database connects");
        c.batch_execute(
            "CREATE TABLE t (id int PRIMARY KEY, n bigint NOT NULL);
             INSERT INTO t SELECT i, 0 FROM generate_series(1, 1000) AS i",
        )
        .and_then(|()| c.batch_execute("VACUUM ANALYZE t"))
        .expect("pgbench's table is made");
        let mut script = tempfile::NamedTempFile::new().expect("a temporary file");
        // The same script as .ci/pgbench-baseline's `update` workload.
        writeln!(
            script,
            "\\set id random(1, 1000)\nUPDATE t SET n = n + 1 WHERE id = :id;"
        )
        .expect("the script is written");
        Some(Pgbench { url, script })
    }

    /// Transactions a second at `clients` clients for the server's seconds, and the WAL the
    /// server wrote a transaction (bytes).
    fn run(&self, server: &Server, clients: usize) -> Option<(f64, Option<f64>)> {
        let secs = server.secs;
        let threads = clients.min(cores());
        let wal_before = wal_bytes(server);
        let out = Command::new("pgbench")
            .args(["-n", "-M", "prepared"])
            .args(["-c", &clients.to_string(), "-j", &threads.to_string()])
            .args(["-T", &format!("{}", secs.round().max(1.0))])
            .arg("-f")
            .arg(self.script.path())
            .arg(&self.url)
            .output()
            .expect("pgbench runs");
        let text = String::from_utf8_lossy(&out.stdout);
        let tps: Option<f64> = text
            .lines()
            .find_map(|l| l.strip_prefix("tps = "))
            .and_then(|l| l.split_whitespace().next())
            .and_then(|t| t.parse().ok());
        let Some(tps) = tps else {
            eprintln!(
                "pgbench failed: {text}{}",
                String::from_utf8_lossy(&out.stderr)
            );
            return None;
        };
        let transactions: Option<f64> = text
            .lines()
            .find_map(|l| l.strip_prefix("number of transactions actually processed: "))
            .and_then(|t| t.split_whitespace().next())
            .and_then(|t| t.parse().ok());
        let wal = wal_before
            .zip(wal_bytes(server))
            .zip(transactions)
            .map(|((b, a), n)| (a - b) as f64 / n.max(1.0));
        Some((tps, wal))
    }
}

// ---------------------------------------------------------------------------------------------
// End to end: runner processes running /bin/true

/// What one end-to-end run gave.
#[derive(Clone, Copy, Debug, Default)]
struct E2e {
    /// Jobs a second, from the enqueue to the last ending.
    rate: f64,
    /// Jobs that took more than one attempt (a lease lost and the job run again).
    reruns: i64,
    /// Deadlocks the server detected in the run's database (PostgreSQL).
    deadlocks: Option<i64>,
    /// The WAL the server wrote a job, bytes, from the enqueue to the last ending
    /// (`pg_current_wal_lsn`: the whole cluster's, so only on a server of the bench's own).
    wal_bytes: Option<f64>,
    /// The CPU of the server's backends connected to the run's database a job, ms (the
    /// runners' and the bench's sessions, from `/proc/PID/stat`).
    server_cpu_ms: Option<f64>,
    /// The share of the run's updates of `jobs` that were HOT.
    hot: Option<f64>,
}

/// Jobs a second from the enqueue of [`E2E_JOBS`] `/bin/true` jobs to the last ending, with 1,
/// 4 and 16 runner processes (each a `Runner` with the defaults: 4 workers, keepers on) on
/// each backend; medians of [`ROUNDS`] rounds.
fn e2e_table(server: &Server) {
    let n_rounds = server.rounds;
    println!();
    println!(
        "end to end: {} jobs of /bin/true enqueued at once (one enqueue_many from the bench's \
         process) into idle runner processes, to the last ending",
        thousands(E2E_JOBS as f64)
    );
    let mut rounds: Vec<Vec<(E2e, E2e)>> = Vec::new();
    for round in 0..server.rounds {
        let mut row = Vec::new();
        for &procs in &server.procs {
            let (pg, lite) = if round % 2 == 0 {
                let pg = e2e(server, Backend::Postgres, procs);
                (pg, e2e(server, Backend::Sqlite, procs))
            } else {
                let lite = e2e(server, Backend::Sqlite, procs);
                (e2e(server, Backend::Postgres, procs), lite)
            };
            eprintln!(
                "  round {} / {n_rounds}, {procs:>2} runner processes: PostgreSQL {} jobs/s \
                 ({} deadlocks, {} jobs rerun), SQLite {} jobs/s ({} rerun)",
                round + 1,
                thousands(pg.rate),
                pg.deadlocks.unwrap_or(0),
                pg.reruns,
                thousands(lite.rate),
                lite.reruns
            );
            row.push((pg, lite));
        }
        rounds.push(row);
    }
    println!(
        "{:<18} {:>14} {:>14} {:>10} {:>22}",
        "runner processes", "PostgreSQL", "SQLite FULL", "PG/SQLite", "PG deadlocks, reruns"
    );
    println!("{}", "-".repeat(82));
    for (i, &procs) in server.procs.iter().enumerate() {
        let ratios: Vec<f64> = rounds.iter().map(|r| r[i].0.rate / r[i].1.rate).collect();
        let deadlocks: i64 = rounds.iter().filter_map(|r| r[i].0.deadlocks).sum();
        let reruns: i64 = rounds.iter().map(|r| r[i].0.reruns).sum();
        let lite_reruns: i64 = rounds.iter().map(|r| r[i].1.reruns).sum();
        println!(
            "{:<18} {:>14} {:>14} {:>10.2} {:>22}{}",
            format!("{procs} x 4 workers"),
            format!(
                "{} jobs/s",
                thousands(mid(rounds.iter().map(|r| r[i].0.rate).collect()))
            ),
            format!(
                "{} jobs/s",
                thousands(mid(rounds.iter().map(|r| r[i].1.rate).collect()))
            ),
            mid(ratios.clone()),
            format!("{deadlocks}, {reruns}"),
            if lite_reruns > 0 {
                format!("  (SQLite reruns: {lite_reruns})")
            } else {
                String::new()
            }
        );
        println!("  (PG/SQLite in each round: {})", listed(&ratios));
        let per_job = |v: Vec<f64>, digits: usize| {
            if v.is_empty() {
                "?".to_string()
            } else {
                format!("{:.*}", digits, mid(v))
            }
        };
        println!(
            "  PostgreSQL a job: {} B of WAL, {} ms of the server's backends' CPU; {} of the updates of jobs HOT",
            per_job(rounds.iter().filter_map(|r| r[i].0.wal_bytes).collect(), 0),
            per_job(
                rounds.iter().filter_map(|r| r[i].0.server_cpu_ms).collect(),
                3
            ),
            per_job(rounds.iter().filter_map(|r| r[i].0.hot).collect(), 2),
        );
    }
    println!(
        "each runner process: Runner::builder(db).start() with the defaults (4 workers, keepers \
         on, durability FULL on SQLite); {n_rounds} rounds, medians; deadlocks (pg_stat_database) \
         and reruns (jobs of more than one attempt) summed over the rounds"
    );
}

/// One end-to-end run.
fn e2e(server: &Server, backend: Backend, procs: usize) -> E2e {
    let target = Target::fresh(server, backend);
    let store = Store::open(&target.db).expect("the bench database opens");
    let mut kids = Kids::spawn(procs, |_| {
        let mut cmd = self_command();
        cmd.args(["__runner", &target.db]);
        cmd
    });
    kids.await_ready();
    let jobs = vec![Job::command(["/bin/true"]); E2E_JOBS];
    let backends = match backend {
        Backend::Postgres => backend_pids(server),
        Backend::Sqlite => Vec::new(),
    };
    let lsn = |server: &Server| -> Option<String> {
        (backend == Backend::Postgres)
            .then(|| wal_lsn(server))
            .flatten()
    };
    let lsn_before = lsn(server);
    let hot_before = (backend == Backend::Postgres)
        .then(|| hot_updates(&target.db))
        .flatten();
    let ticks_before = cpu_ticks(&backends);
    let t = Instant::now();
    store.enqueue_many(&jobs).expect("the jobs are enqueued");
    let deadline = t + Duration::from_secs(600);
    while store.has_unfinished(&[]).expect("the bench database reads") {
        assert!(Instant::now() < deadline, "the jobs end within 10 minutes");
        std::thread::sleep(Duration::from_millis(5));
    }
    let rate = E2E_JOBS as f64 / t.elapsed().as_secs_f64();
    let ticks_after = cpu_ticks(&backends);
    let wal = lsn_before
        .zip(lsn(server))
        .and_then(|(b, a)| wal_diff(server, &a, &b))
        .map(|bytes| bytes as f64 / E2E_JOBS as f64);
    let tick = 1000.0 / clock_ticks_per_sec() as f64;
    let server_cpu_ms = ticks_before
        .zip(ticks_after)
        .map(|(b, a)| a.saturating_sub(b) as f64 * tick / E2E_JOBS as f64);
    assert_eq!(
        store.counts().expect("counts").succeeded,
        E2E_JOBS as u64,
        "every /bin/true job succeeds"
    );
    drop(store);
    kids.stop();
    let reruns_sql = "SELECT count(*) FROM jobs WHERE attempt > 1";
    match backend {
        Backend::Postgres => {
            let mut c = Client::connect(&target.db, NoTls).expect("the bench database connects");
            let reruns: i64 = c.query_one(reruns_sql, &[]).expect("reruns").get(0);
            E2e {
                rate,
                reruns,
                deadlocks: deadlocks(server),
                wal_bytes: wal,
                server_cpu_ms,
                hot: {
                    std::thread::sleep(Duration::from_millis(1100));
                    hot_share(hot_before, hot_updates(&target.db))
                },
            }
        }
        Backend::Sqlite => {
            let c = rusqlite::Connection::open(&target.db).expect("the bench file opens");
            let reruns: i64 = c.query_row(reruns_sql, [], |r| r.get(0)).expect("reruns");
            E2e {
                rate,
                reruns,
                deadlocks: None,
                wal_bytes: None,
                server_cpu_ms: None,
                hot: None,
            }
        }
    }
}

/// The server's WAL insert position, as text (`pg_current_wal_lsn`).
fn wal_lsn(server: &Server) -> Option<String> {
    server
        .admin()
        .query_one("SELECT pg_current_wal_lsn()::text", &[])
        .ok()
        .map(|r| r.get(0))
}

/// Bytes of WAL between two positions (`pg_wal_lsn_diff`).
fn wal_diff(server: &Server, after: &str, before: &str) -> Option<i64> {
    server
        .admin()
        .query_one(
            "SELECT pg_wal_lsn_diff($1::text::pg_lsn, $2::text::pg_lsn)::bigint",
            &[&after, &before],
        )
        .ok()
        .map(|r| r.get(0))
}

/// The deadlocks the server has detected in the bench's database since it was made.
fn deadlocks(server: &Server) -> Option<i64> {
    // The backends that ended have flushed their statistics; a moment for the last ones.
    std::thread::sleep(Duration::from_millis(1100));
    server
        .admin()
        .query_one(
            "SELECT deadlocks FROM pg_stat_database WHERE datname = $1",
            &[&BENCH_DB],
        )
        .ok()
        .map(|r| r.get(0))
}

// ---------------------------------------------------------------------------------------------
// Enqueue-to-start latency

/// From before an enqueue call to the moment the job's own process writes a marker, measured
/// by the bench on one monotonic clock (the marker goes through a FIFO that a thread of the
/// bench reads), with an idle runner in one process and the enqueues in another; beside the
/// same command spawned directly by the bench. Also the database's `started_at - created_at`.
fn latency_table(server: &Server) {
    println!();
    println!(
        "enqueue-to-start: an idle runner process (defaults), one job at a time enqueued by \
         another process (its own Store::enqueue), to the job's `sh -c 'echo x > FIFO'` writing \
         its marker"
    );
    println!(
        "{:<66} {:>8} {:>8} {:>14}",
        "", "p50 ms", "p99 ms", "db p50/p99 ms"
    );
    println!("{}", "-".repeat(99));
    let fifo_dir = tempfile::tempdir().expect("a temporary folder can be created");
    let marks = Marks::open(fifo_dir.path());
    let bare = bare_marker_latency(&marks, LATENCY_JOBS);
    print_latency("bare: the same command spawned by the bench", &bare, None);
    for (backend, state, n) in [
        (Backend::Sqlite, State::Default, LATENCY_JOBS),
        (Backend::Postgres, State::Default, LATENCY_JOBS),
        (Backend::Postgres, State::Short, LATENCY_JOBS),
        (Backend::Postgres, State::Apart, POLL_LATENCY_JOBS),
    ] {
        let run = runner_latency(server, backend, state, &marks, n);
        let socket = match run.socket {
            Some(true) => "socket bound",
            Some(false) => "no socket bound",
            None => "",
        };
        let label = match (backend, state) {
            (Backend::Sqlite, _) => "SQLite, same host (wake-up folder beside the file)".into(),
            (_, State::Default) => {
                format!("PostgreSQL, same host, state folder in $HOME: {socket}")
            }
            (_, State::Short) => format!("PostgreSQL, same host, a short state folder: {socket}"),
            (_, State::Apart) => "PostgreSQL, as from another host (no shared folder)".into(),
        };
        print_latency(&label, &run.client, Some(&run.db));
    }
    marks.stop();
    println!(
        "same host: the enqueue pokes the runners' wake-up sockets: beside a SQLite file; on \
         PostgreSQL in this host's state folder ($XDG_STATE_HOME or ~/.local/state, then \
         leasehold/pg-<url>-on-<host>-<hash>-wake), whose socket paths must fit the 107 bytes of \
         a Unix socket's address: `$HOME` with database `{BENCH_DB}`, or a short \
         folder (/tmp/lhXXXXXX) with database `{SHORT_DB}`. As from another host: the runner has \
         a state folder of its own, so no poke reaches it; the server's LISTEN/NOTIFY wakes it \
         once the store sends one, else its fallback poll ({} ms). db = started_at - created_at \
         (on PostgreSQL, both the server's clock).",
        leasehold::DEFAULT_POLL_INTERVAL.as_millis()
    );
}

/// A database name short enough for a runner's wake-up socket to fit in a short state folder.
const SHORT_DB: &str = "lb";

/// Where the runner and the enqueuer keep this host's state (`XDG_STATE_HOME`).
#[derive(Clone, Copy, PartialEq, Eq)]
enum State {
    /// As the bench's environment has it (for a user: `~/.local/state`).
    Default,
    /// One short folder for both, `/tmp/lhXXXXXX`, and the database [`SHORT_DB`].
    Short,
    /// A folder of the runner's own: nothing of the enqueuer's reaches it.
    Apart,
}

fn print_latency(label: &str, ms: &[f64], db: Option<&[i64]>) {
    let q = |q: f64| {
        let i = ((ms.len() - 1) as f64 * q).round() as usize;
        ms[i]
    };
    println!(
        "{label:<66} {:>8.2} {:>8.2} {:>14}",
        q(0.5),
        q(0.99),
        db.map_or(String::new(), |d| format!(
            "{} / {}",
            quantile(d, 0.5),
            quantile(d, 0.99)
        ))
    );
}

/// A FIFO in a folder of the bench's and a thread that reads it: each line written into it is
/// a marker, and the time the thread read it is sent on.
struct Marks {
    fifo: std::path::PathBuf,
    seen: mpsc::Receiver<Instant>,
    thread: std::thread::JoinHandle<()>,
}

impl Marks {
    fn open(dir: &std::path::Path) -> Marks {
        let fifo = dir.join("marks");
        nix::unistd::mkfifo(&fifo, nix::sys::stat::Mode::S_IRWXU).expect("the FIFO is made");
        // Read and write: the open does not wait for a writer, and the reads never see an end.
        let file = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .open(&fifo)
            .expect("the FIFO opens");
        let (tx, seen) = mpsc::channel();
        let thread = std::thread::spawn(move || {
            for line in BufReader::new(file).lines() {
                let at = Instant::now();
                match line {
                    Ok(l) if l == "stop" => break,
                    Ok(_) => {
                        if tx.send(at).is_err() {
                            break;
                        }
                    }
                    Err(_) => break,
                }
            }
        });
        Marks { fifo, seen, thread }
    }

    /// The command that writes one marker.
    fn command(&self) -> [String; 3] {
        marker_command(&self.fifo.to_string_lossy())
    }

    /// When the next marker came.
    fn next(&self) -> Instant {
        self.seen
            .recv_timeout(Duration::from_secs(60))
            .expect("the job writes its marker within 60 s")
    }

    fn stop(self) {
        std::fs::write(&self.fifo, "stop\n").expect("the FIFO takes the stop");
        self.thread
            .join()
            .expect("the FIFO's reader does not panic");
    }
}

/// The command that writes one marker into `fifo`.
fn marker_command(fifo: &str) -> [String; 3] {
    ["sh".into(), "-c".into(), format!("echo x > '{fifo}'")]
}

/// The marker command spawned by the bench itself, `n` times: ms from before the spawn to the
/// marker, sorted.
fn bare_marker_latency(marks: &Marks, n: usize) -> Vec<f64> {
    let [sh, c, script] = marks.command();
    let mut ms: Vec<f64> = (0..n)
        .map(|_| {
            let t = Instant::now();
            let mut child = Command::new(&sh)
                .args([&c, &script])
                .spawn()
                .expect("sh starts");
            let at = marks.next();
            child.wait().expect("sh ends");
            (at - t).as_secs_f64() * 1000.0
        })
        .collect();
    ms.sort_by(f64::total_cmp);
    ms
}

/// What [`runner_latency`] found.
struct LatencyRun {
    /// ms from before each enqueue to its marker, sorted.
    client: Vec<f64>,
    /// `started_at - created_at` of each job, sorted.
    db: Vec<i64>,
    /// On PostgreSQL, whether the runner's wake-up folder held a socket.
    socket: Option<bool>,
}

/// `n` jobs, one at a time, enqueued by an `__enqueue` child into an idle `__runner` child on
/// a fresh `backend` database, with their state folders as `state` says.
fn runner_latency(
    server: &Server,
    backend: Backend,
    state: State,
    marks: &Marks,
    n: usize,
) -> LatencyRun {
    let target = match (backend, state) {
        (Backend::Postgres, State::Short) => Target {
            backend,
            db: server.fresh(SHORT_DB),
            _dir: None,
        },
        _ => Target::fresh(server, backend),
    };
    let store = Store::open(&target.db).expect("the bench database opens");
    let folder = tempfile::Builder::new()
        .prefix("lh")
        .tempdir_in("/tmp")
        .expect("a temporary folder can be made in /tmp");
    let (runner_state, enqueuer_state) = match state {
        State::Default => (None, None),
        State::Short => (
            Some(folder.path().to_path_buf()),
            Some(folder.path().to_path_buf()),
        ),
        State::Apart => (Some(folder.path().to_path_buf()), None),
    };
    let with_state = |mut cmd: Command, dir: &Option<std::path::PathBuf>| {
        if let Some(dir) = dir {
            cmd.env("XDG_STATE_HOME", dir);
        }
        cmd
    };
    let mut runner = Kids::spawn(1, |_| {
        let mut cmd = self_command();
        cmd.args(["__runner", &target.db]);
        with_state(cmd, &runner_state)
    });
    runner.await_ready();
    let socket = (backend == Backend::Postgres).then(|| {
        let base = runner_state.clone().or_else(|| {
            std::env::var_os("XDG_STATE_HOME")
                .filter(|d| !d.is_empty())
                .map(Into::into)
                .or_else(|| {
                    std::env::var_os("HOME").map(|h| std::path::Path::new(&h).join(".local/state"))
                })
        });
        base.is_some_and(|b| socket_bound(&b.join("leasehold"), &target.db))
    });
    let mut enqueuer = Kids::spawn(1, |_| {
        let mut cmd = self_command();
        cmd.args(["__enqueue", &target.db, &marks.fifo.to_string_lossy()]);
        with_state(cmd, &enqueuer_state)
    });
    enqueuer.await_ready();
    let mut client = Vec::with_capacity(n);
    let mut db = Vec::with_capacity(n);
    for _ in 0..n {
        let t = Instant::now();
        let id: i64 = enqueuer
            .ask("enqueue")
            .trim()
            .parse()
            .expect("the enqueuer answers with the job's id");
        let at = marks.next();
        client.push((at - t).as_secs_f64() * 1000.0);
        let record = loop {
            let record = store.job(id).expect("the job reads");
            if record.completed_at.is_some() {
                break record;
            }
            std::thread::sleep(Duration::from_millis(1));
        };
        db.push(record.started_at.expect("it started") - record.created_at);
        // Let the runner settle back into its wait: the ending of one job must not be what
        // wakes it for the next.
        std::thread::sleep(Duration::from_millis(20));
    }
    drop(store);
    enqueuer.stop();
    runner.stop();
    if state == State::Short {
        server.drop_db(SHORT_DB);
    }
    client.sort_by(f64::total_cmp);
    db.sort_unstable();
    LatencyRun { client, db, socket }
}

/// Whether a wake-up folder of database `url` in `state` (this host's `leasehold` state
/// folder) holds a socket.
fn socket_bound(state: &std::path::Path, url: &str) -> bool {
    let database = url.rsplit('/').next().unwrap_or_default();
    let Ok(entries) = std::fs::read_dir(state) else {
        return false;
    };
    entries.flatten().any(|e| {
        let name = e.file_name().to_string_lossy().into_owned();
        name.contains(&format!("_{database}-on-"))
            && name.ends_with("-wake")
            && std::fs::read_dir(e.path()).is_ok_and(|mut d| {
                d.any(|s| s.is_ok_and(|s| s.file_name().to_string_lossy().ends_with(".sock")))
            })
    })
}

// ---------------------------------------------------------------------------------------------
// The cycle, part by part

/// What a PostgreSQL cycle is made of, at 1 and at 16 processes: the statements each claim
/// and finish sends (from `pg_stat_statements`, when the server loads it), their server time,
/// what the server's backends wait on (sampled from `pg_stat_activity`), the round trip of a
/// bare statement, and the cost of a commit (pgbench at one client).
fn profile(server: &Server, pgbench: (Option<f64>, Option<f64>)) {
    // Run alone, it measures pgbench's rates itself.
    let pgbench = match pgbench {
        (None, None) => Pgbench::setup(server).map_or((None, None), |p| {
            let tps = |clients| p.run(server, clients).map(|(tps, _)| tps);
            (tps(1), tps(16))
        }),
        given => given,
    };
    println!();
    let rtt = round_trip(server);
    println!(
        "the PostgreSQL cycle, part by part; the round trip of a prepared `SELECT 1` from this \
         host: {:.3} ms (median of 2,000)",
        rtt * 1000.0
    );
    profile_at(server, 1, rtt, pgbench.0, Variant::Store);
    profile_at(server, 16, rtt, pgbench.1, Variant::Store);
    profile_at(server, 16, rtt, pgbench.1, Variant::StoreBatch);
    profile_at(server, 16, rtt, pgbench.1, Variant::NoCounters);
    profile_at(server, 16, rtt, pgbench.1, Variant::Bare);
    profile_at(server, 16, rtt, pgbench.1, Variant::BareBatch);
}

/// What the processes of a [`profile`] run are.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Variant {
    /// leasehold's Store, as it is.
    Store,
    /// leasehold's Store, [`BATCH`] jobs a claim and one `finish_many` of them.
    StoreBatch,
    /// leasehold's Store on a database where a trigger drops every upsert of
    /// `metric_counters` and `metric_histograms` before it reaches its row: what the cycle
    /// would be if those rows were not one hot row each (an experiment, not a design).
    NoCounters,
    /// The bare client: one statement a transition ([`BARE_CLAIM`], [`BARE_FINISH`]).
    Bare,
    /// The bare client, [`BATCH`] jobs a statement ([`BARE_CLAIM_BATCH`],
    /// [`BARE_FINISH_BATCH`]): claims and endings grouped as River's fetches and completer
    /// group them.
    BareBatch,
}

/// Drops every row inserted into the metrics' counters and histograms, so that no upsert
/// takes their rows' locks.
const DROP_COUNTERS: &str = "
    CREATE FUNCTION bench_drop_row() RETURNS trigger LANGUAGE plpgsql AS
        $$ BEGIN RETURN NULL; END $$;
    CREATE TRIGGER bench_drop_row BEFORE INSERT ON metric_counter_shards
        FOR EACH ROW EXECUTE FUNCTION bench_drop_row();
    CREATE TRIGGER bench_drop_row BEFORE INSERT ON metric_histogram_shards
        FOR EACH ROW EXECUTE FUNCTION bench_drop_row();";

/// One run of [`profile`] at `procs` processes.
fn profile_at(server: &Server, procs: usize, rtt: f64, pgbench: Option<f64>, variant: Variant) {
    println!();
    let target = Target::fresh(server, Backend::Postgres);
    let jobs = match variant {
        Variant::BareBatch | Variant::StoreBatch => BATCH_JOBS,
        _ => CYCLE_JOBS,
    };
    fill(&target, jobs);
    let mut c = Client::connect(&target.db, NoTls).expect("the bench database connects");
    if variant == Variant::NoCounters {
        c.batch_execute(DROP_COUNTERS)
            .expect("the counters' dropping trigger is made");
    }
    let tracked = c
        .batch_execute("CREATE EXTENSION IF NOT EXISTS pg_stat_statements")
        .and_then(|()| c.batch_execute("SELECT pg_stat_statements_reset()"))
        .is_ok();
    let child = match variant {
        Variant::Bare => "__bare_cycles",
        Variant::BareBatch => "__bare_batch_cycles",
        Variant::StoreBatch => "__batch_cycles",
        _ => "__cycles",
    };
    let mut kids = Kids::spawn(procs, |i| {
        let mut cmd = self_command();
        cmd.args([
            child,
            &target.db,
            &server.secs.to_string(),
            &format!("bench-{i}"),
        ]);
        cmd
    });
    kids.await_ready();
    if tracked {
        c.batch_execute("SELECT pg_stat_statements_reset()")
            .expect("pg_stat_statements resets");
    }
    let wal_before = wal_bytes(server);
    let sampler = WaitSampler::start(&target.db);
    let results = kids.go();
    let waits = sampler.stop();
    kids.stop();
    let run = summarize(&results, None);
    let n = results.iter().map(|r| r.cycles).sum::<u64>().max(1) as f64;
    let wal = wal_before
        .zip(wal_bytes(server))
        .map_or("?".into(), |(b, a)| thousands((a - b) as f64 / n));
    println!(
        "{procs} process{}, {}: {} cycles/s; in a process, claim {:.3} ms + finish {:.3} ms, of \
         which {:.3} ms its own CPU; {wal} B of WAL a cycle",
        if procs == 1 { "" } else { "es" },
        match variant {
            Variant::Store => "leasehold's Store",
            Variant::StoreBatch => "leasehold's Store, 16 jobs a claim and a finish_many",
            Variant::NoCounters =>
                "leasehold's Store, its counters' and histograms' upserts dropped by a trigger",
            Variant::Bare => "bare client, one statement a transition",
            Variant::BareBatch => "bare client, 16 jobs a statement (a cycle: one job)",
        },
        thousands(run.rate),
        run.claim_ms,
        run.finish_ms,
        run.client_cpu_ms
    );
    let total: u64 = waits.iter().map(|(_, k)| k).sum();
    let shares: Vec<String> = waits
        .iter()
        .take(8)
        .map(|(what, k)| format!("{what} {:.0}%", *k as f64 * 100.0 / total.max(1) as f64))
        .collect();
    println!(
        "  the backends' state, sampled every 5 ms from pg_stat_activity: {}",
        shares.join(", ")
    );
    if !tracked {
        println!(
            "(pg_stat_statements is not loaded on this server: add \
             shared_preload_libraries = 'pg_stat_statements' to count the statements a cycle)"
        );
        return;
    }
    let mut c = Client::connect(&target.db, NoTls).expect("the bench database connects");
    let rows = c
        .query(
            "SELECT calls, plans, total_exec_time, total_plan_time, wal_bytes::bigint, query
             FROM pg_stat_statements
             WHERE dbid = (SELECT oid FROM pg_database WHERE datname = current_database())
               AND query NOT LIKE '%pg_stat_statements%' AND query NOT LIKE '%pg_stat_activity%'
             ORDER BY calls DESC, total_exec_time DESC",
            &[],
        )
        .expect("pg_stat_statements reads");
    println!(
        "{:>8} {:>8} {:>10} {:>10} {:>8}  statement (pg_stat_statements, this database, during the run)",
        "a cycle", "plans", "exec ms", "plan ms", "WAL B"
    );
    let (mut statements, mut exec_ms, mut plan_ms) = (0.0, 0.0, 0.0);
    for r in &rows {
        let calls: i64 = r.get(0);
        let plans: i64 = r.get(1);
        let exec: f64 = r.get(2);
        let plan: f64 = r.get(3);
        let wal: i64 = r.get(4);
        let query: String = r.get(5);
        let per = calls as f64 / n;
        if per < 0.01 {
            continue;
        }
        statements += per;
        exec_ms += exec / n;
        plan_ms += plan / n;
        let text: String = query.split_whitespace().collect::<Vec<_>>().join(" ");
        let text: String = text.chars().take(80).collect();
        println!(
            "{per:>8.2} {:>8.2} {:>10.4} {:>10.4} {:>8.0}  {text}",
            plans as f64 / n,
            exec / n,
            plan / n,
            wal as f64 / n
        );
    }
    let cycle_ms = 1000.0 * procs as f64 / run.rate;
    println!(
        "(columns a cycle: calls, plans made, execution and planning ms (planning with \
         pg_stat_statements.track_planning on), WAL bytes)"
    );
    println!(
        "{statements:.1} statements a cycle, each its own round trip: {:.3} ms of round trips \
         ({:.3} ms each), {exec_ms:.3} ms executing and {plan_ms:.3} ms planning in the server; \
         not in these: the 2 commits' WAL flushes ({}) and the protocol's own work; a cycle \
         took {cycle_ms:.3} ms in a process, of which {:.3} ms its own CPU",
        statements * rtt * 1000.0,
        rtt * 1000.0,
        pgbench.map_or("-".into(), |t| format!(
            "pgbench at {procs} client{}: {:.3} ms a transaction",
            if procs == 1 { "" } else { "s" },
            1000.0 * procs as f64 / t
        )),
        run.client_cpu_ms
    );
}

/// A thread that samples what the backends on a database are doing, every 5 ms.
struct WaitSampler {
    stop: std::sync::Arc<std::sync::atomic::AtomicBool>,
    thread: std::thread::JoinHandle<std::collections::HashMap<String, u64>>,
}

impl WaitSampler {
    fn start(db: &str) -> WaitSampler {
        let mut c = Client::connect(db, NoTls).expect("the bench database connects");
        let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        let stopped = stop.clone();
        let thread = std::thread::spawn(move || {
            let query = c
                .prepare(
                    "SELECT CASE WHEN state = 'active' AND wait_event IS NULL THEN 'running'
                                 WHEN state = 'active' THEN wait_event_type || ':' || wait_event
                                 ELSE state || ':' || coalesce(wait_event, '') END, count(*)
                     FROM pg_stat_activity
                     WHERE datname = current_database() AND pid <> pg_backend_pid()
                       AND backend_type = 'client backend'
                     GROUP BY 1",
                )
                .expect("prepare");
            let mut seen = std::collections::HashMap::new();
            while !stopped.load(std::sync::atomic::Ordering::Relaxed) {
                for r in c.query(&query, &[]).unwrap_or_default() {
                    *seen.entry(r.get::<_, String>(0)).or_insert(0) += r.get::<_, i64>(1) as u64;
                }
                std::thread::sleep(Duration::from_millis(5));
            }
            seen
        });
        WaitSampler { stop, thread }
    }

    /// Stops sampling; what was seen, most often first.
    fn stop(self) -> Vec<(String, u64)> {
        self.stop.store(true, std::sync::atomic::Ordering::Relaxed);
        let seen = self.thread.join().expect("the sampler does not panic");
        let mut seen: Vec<(String, u64)> = seen.into_iter().collect();
        seen.sort_by_key(|s| std::cmp::Reverse(s.1));
        seen
    }
}

/// The median time of a prepared `SELECT 1` round trip to the server, in seconds.
fn round_trip(server: &Server) -> f64 {
    let mut c = server.admin();
    let stmt = c.prepare("SELECT 1").expect("prepare");
    let mut times: Vec<f64> = (0..2000)
        .map(|_| {
            let t = Instant::now();
            c.query_one(&stmt, &[]).expect("SELECT 1");
            t.elapsed().as_secs_f64()
        })
        .collect();
    mid_in_place(&mut times)
}

// ---------------------------------------------------------------------------------------------
// The children

/// The bench's own executable, to run again as a child.
fn self_command() -> Command {
    let exe = std::env::current_exe().expect("the bench knows its own executable");
    let mut cmd = Command::new(exe);
    cmd.stdin(Stdio::piped()).stdout(Stdio::piped());
    cmd
}

/// What a `__cycles` child reports.
#[derive(Clone, Copy, Debug, Default)]
struct ChildReport {
    cycles: u64,
    elapsed: Duration,
    claim: Duration,
    finish: Duration,
    cpu: Duration,
    dry: bool,
}

/// Children of the bench, each told when to go and when to stop through its stdin, and killed
/// (by PID) if the bench ends before they do.
struct Kids {
    children: Vec<(Child, Option<ChildStdin>, BufReader<ChildStdout>)>,
}

impl Kids {
    fn spawn(n: usize, command: impl Fn(usize) -> Command) -> Kids {
        let children = (0..n)
            .map(|i| {
                let mut child = command(i).spawn().expect("the bench's child starts");
                let stdin = child.stdin.take();
                let stdout = BufReader::new(child.stdout.take().expect("piped"));
                (child, stdin, stdout)
            })
            .collect();
        Kids { children }
    }

    fn line(out: &mut BufReader<ChildStdout>) -> String {
        let mut line = String::new();
        out.read_line(&mut line).expect("the child's stdout reads");
        assert!(!line.is_empty(), "a child of the bench ended early");
        line
    }

    fn tell(&mut self, word: &str) {
        for (_, stdin, _) in &mut self.children {
            let stdin = stdin.as_mut().expect("the child's stdin is open");
            writeln!(stdin, "{word}").expect("the child reads its stdin");
            stdin.flush().expect("the child reads its stdin");
        }
    }

    /// Waits until every child says it is ready.
    fn await_ready(&mut self) {
        for (_, _, out) in &mut self.children {
            let line = Kids::line(out);
            assert_eq!(
                line.trim(),
                "ready",
                "a child of the bench says it is ready"
            );
        }
    }

    /// Sends `word` to the only child and returns its answer.
    fn ask(&mut self, word: &str) -> String {
        self.tell(word);
        let (_, _, out) = &mut self.children[0];
        Kids::line(out)
    }

    /// Tells every `__cycles` child to go; returns their reports.
    fn go(&mut self) -> Vec<ChildReport> {
        self.tell("go");
        self.children
            .iter_mut()
            .map(|(_, _, out)| ChildReport::parse(&Kids::line(out)))
            .collect()
    }

    /// Closes every child's stdin, which tells it to end (a runner shuts down), and waits for
    /// each.
    fn stop(mut self) {
        for (_, stdin, _) in &mut self.children {
            drop(stdin.take());
        }
        for (child, _, _) in &mut self.children {
            let status = child.wait().expect("the child is waited for");
            assert!(status.success(), "a child of the bench failed: {status}");
        }
        self.children.clear();
    }
}

impl Drop for Kids {
    /// Kills, by PID, the children still running (the bench is failing).
    fn drop(&mut self) {
        for (child, _, _) in &mut self.children {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

impl ChildReport {
    /// `done CYCLES ELAPSED_NS CLAIM_NS FINISH_NS CPU_NS DRY`.
    fn parse(line: &str) -> ChildReport {
        let f: Vec<&str> = line.split_whitespace().collect();
        assert!(f.len() == 7 && f[0] == "done", "a child's report: {line:?}");
        let ns = |i: usize| Duration::from_nanos(f[i].parse().expect("a number"));
        ChildReport {
            cycles: f[1].parse().expect("a number"),
            elapsed: ns(2),
            claim: ns(3),
            finish: ns(4),
            cpu: ns(5),
            dry: f[6] == "1",
        }
    }
}

/// Runs the bench as one of its own children when the first argument names one; returns false
/// otherwise.
pub fn child(args: &[String]) -> bool {
    match args.get(1).map(String::as_str) {
        Some("__cycles") => {
            let secs: f64 = args[3].parse().expect("seconds");
            cycles_child(&args[2], Duration::from_secs_f64(secs), &args[4]);
            true
        }
        Some("__batch_cycles") => {
            let secs: f64 = args[3].parse().expect("seconds");
            batch_cycles_child(&args[2], Duration::from_secs_f64(secs), &args[4]);
            true
        }
        Some("__bare_cycles") => {
            let secs: f64 = args[3].parse().expect("seconds");
            bare_cycles_child(&args[2], Duration::from_secs_f64(secs), &args[4]);
            true
        }
        Some("__bare_batch_cycles") => {
            let secs: f64 = args[3].parse().expect("seconds");
            bare_batch_cycles_child(&args[2], Duration::from_secs_f64(secs), &args[4]);
            true
        }
        Some("__enqueue") => {
            enqueue_child(&args[2], &args[3]);
            true
        }
        Some("__runner") => {
            runner_child(&args[2]);
            true
        }
        _ => false,
    }
}

fn read_stdin_line() -> String {
    let mut line = String::new();
    let _ = std::io::stdin().read_line(&mut line);
    line
}

/// A `__cycles` child: opens its own Store, says `ready`, waits for `go`, then claims one job
/// and records its success, again and again for `secs` or until none is left; reports, and
/// waits for its stdin to close before it closes its connection (the bench reads its
/// backend's CPU first).
fn cycles_child(db: &str, secs: Duration, worker: &str) {
    let store = Store::open(db).expect("the bench database opens");
    println!("ready");
    read_stdin_line();
    let cpu0 = cpu_time();
    let t = Instant::now();
    let (mut n, mut claim, mut finish, mut dry) = (0u64, Duration::ZERO, Duration::ZERO, false);
    let req = ClaimRequest {
        worker_id: worker,
        limit: 1,
        queues: &[],
        lease_ttl: Duration::from_secs(30),
        queue_caps: &[],
        unheld: 0,
    };
    while t.elapsed() < secs {
        let c0 = Instant::now();
        let Some(c) = store.claim(&req, now_ms()).expect("claim").pop() else {
            dry = true;
            break;
        };
        let c1 = Instant::now();
        let done = store
            .finish(
                &Finish {
                    job_id: c.id,
                    run_token: c.run_token,
                    attempt: c.attempt,
                    ending: Ending::Succeeded,
                    output: None,
                    notes: Vec::new(),
                    max_recovery_attempts: 3,
                },
                now_ms(),
            )
            .expect("finish");
        assert!(matches!(done, Finished::Recorded(_)), "{done:?}");
        claim += c1 - c0;
        finish += c1.elapsed();
        n += 1;
    }
    let elapsed = t.elapsed();
    let cpu = cpu_time().saturating_sub(cpu0);
    println!(
        "done {n} {} {} {} {} {}",
        elapsed.as_nanos(),
        claim.as_nanos(),
        finish.as_nanos(),
        cpu.as_nanos(),
        u8::from(dry)
    );
    read_stdin_line();
}

/// A `__batch_cycles` child: as [`cycles_child`], with [`BATCH`] jobs a claim and their
/// successes recorded by one `finish_many`, as a runner's dispatcher claims ahead and its
/// writer groups endings; a cycle is still one job.
fn batch_cycles_child(db: &str, secs: Duration, worker: &str) {
    let store = Store::open(db).expect("the bench database opens");
    println!("ready");
    read_stdin_line();
    let cpu0 = cpu_time();
    let t = Instant::now();
    let (mut n, mut claim, mut finish, mut dry) = (0u64, Duration::ZERO, Duration::ZERO, false);
    let req = ClaimRequest {
        worker_id: worker,
        limit: BATCH as u32,
        queues: &[],
        lease_ttl: Duration::from_secs(30),
        queue_caps: &[],
        unheld: 0,
    };
    while t.elapsed() < secs {
        let c0 = Instant::now();
        let claimed = store.claim(&req, now_ms()).expect("claim");
        if claimed.is_empty() {
            dry = true;
            break;
        }
        let c1 = Instant::now();
        let finishes: Vec<Finish> = claimed
            .into_iter()
            .map(|c| Finish {
                job_id: c.id,
                run_token: c.run_token,
                attempt: c.attempt,
                ending: Ending::Succeeded,
                output: None,
                notes: Vec::new(),
                max_recovery_attempts: 3,
            })
            .collect();
        let done = store.finish_many(&finishes, now_ms()).expect("finish");
        assert!(
            done.iter().all(|d| matches!(d, Finished::Recorded(_))),
            "{done:?}"
        );
        claim += c1 - c0;
        finish += c1.elapsed();
        n += finishes.len() as u64;
    }
    let elapsed = t.elapsed();
    let cpu = cpu_time().saturating_sub(cpu0);
    println!(
        "done {n} {} {} {} {} {}",
        elapsed.as_nanos(),
        claim.as_nanos(),
        finish.as_nanos(),
        cpu.as_nanos(),
        u8::from(dry)
    );
    read_stdin_line();
}

/// This process's CPU time so far, user and system.
fn cpu_time() -> Duration {
    use nix::sys::resource::{UsageWho, getrusage};
    let usage = getrusage(UsageWho::RUSAGE_SELF).expect("getrusage");
    let tv = |t: nix::sys::time::TimeVal| {
        Duration::from_secs(t.tv_sec() as u64) + Duration::from_micros(t.tv_usec() as u64)
    };
    tv(usage.user_time()) + tv(usage.system_time())
}

/// A claim of one job in one statement, autocommitted: the read of the claim index's head
/// (`FOR UPDATE SKIP LOCKED`), the job's row as leasehold's claim writes it and its `claimed`
/// event, at the server's time. Parameter: worker id.
const BARE_CLAIM: &str = "WITH now AS (SELECT leasehold_now_ms() AS ms),
     c AS (SELECT id FROM jobs
           WHERE status = 'pending' AND teardown_token IS NULL AND waiting = 0 AND deferred = 0
             AND scheduled_at <= (SELECT ms FROM now)
           ORDER BY priority DESC, scheduled_at, id LIMIT 1 FOR UPDATE SKIP LOCKED),
     u AS (UPDATE jobs SET status = 'running', attempt = jobs.attempt + 1,
               run_token = replace(gen_random_uuid()::text, '-', ''), worker_id = $1,
               started_at = now.ms, heartbeat_at = now.ms, lease_expires_at = now.ms + 30000,
               completed_at = NULL, pid = NULL, pgid = NULL, proc_start_time = NULL,
               exit_code = NULL, signal = NULL, error_kind = NULL, keeper_pid = NULL,
               keeper_start_time = NULL
           FROM c, now WHERE jobs.id = c.id
           RETURNING jobs.id, jobs.attempt, jobs.run_token, jobs.argv, now.ms),
     e AS (INSERT INTO job_events (job_id, at, kind, attempt, detail)
           SELECT id, ms, 'claimed', attempt, 'worker ' || $1 FROM u)
SELECT id, run_token, argv FROM u";

/// The success of a claimed attempt in one statement, autocommitted: the job's row as
/// leasehold's success writes it, fenced by its token, and its `succeeded` event. Parameters:
/// id, run token.
const BARE_FINISH: &str = "WITH now AS (SELECT leasehold_now_ms() AS ms),
     u AS (UPDATE jobs SET status = 'succeeded', completed_at = now.ms, exit_code = 0,
               signal = NULL, error_kind = NULL, lease_expires_at = NULL, heartbeat_at = now.ms
           FROM now WHERE id = $1 AND status = 'running' AND run_token = $2
           RETURNING jobs.id, jobs.attempt, now.ms)
INSERT INTO job_events (job_id, at, kind, attempt, detail)
SELECT id, ms, 'succeeded', attempt, 'exit 0' FROM u";

/// How many jobs the batched bare client claims, and then finishes, in one statement each.
const BATCH: i64 = 16;

/// [`BARE_CLAIM`] of up to `$2` jobs. Parameters: worker id, limit.
const BARE_CLAIM_BATCH: &str = "WITH now AS (SELECT leasehold_now_ms() AS ms),
     c AS (SELECT id FROM jobs
           WHERE status = 'pending' AND teardown_token IS NULL AND waiting = 0 AND deferred = 0
             AND scheduled_at <= (SELECT ms FROM now)
           ORDER BY priority DESC, scheduled_at, id LIMIT $2 FOR UPDATE SKIP LOCKED),
     u AS (UPDATE jobs SET status = 'running', attempt = jobs.attempt + 1,
               run_token = replace(gen_random_uuid()::text, '-', ''), worker_id = $1,
               started_at = now.ms, heartbeat_at = now.ms, lease_expires_at = now.ms + 30000,
               completed_at = NULL, pid = NULL, pgid = NULL, proc_start_time = NULL,
               exit_code = NULL, signal = NULL, error_kind = NULL, keeper_pid = NULL,
               keeper_start_time = NULL
           FROM c, now WHERE jobs.id = c.id
           RETURNING jobs.id, jobs.attempt, jobs.run_token, jobs.argv, now.ms),
     e AS (INSERT INTO job_events (job_id, at, kind, attempt, detail)
           SELECT id, ms, 'claimed', attempt, 'worker ' || $1 FROM u)
SELECT id, run_token, argv FROM u";

/// [`BARE_FINISH`] of many attempts. Parameters: ids, run tokens (arrays, in pairs).
const BARE_FINISH_BATCH: &str = "WITH now AS (SELECT leasehold_now_ms() AS ms),
     f AS (SELECT * FROM unnest($1::bigint[], $2::text[]) AS f(id, token)),
     u AS (UPDATE jobs SET status = 'succeeded', completed_at = now.ms, exit_code = 0,
               signal = NULL, error_kind = NULL, lease_expires_at = NULL, heartbeat_at = now.ms
           FROM now, f
           WHERE jobs.id = f.id AND jobs.status = 'running' AND jobs.run_token = f.token
           RETURNING jobs.id, jobs.attempt, now.ms)
INSERT INTO job_events (job_id, at, kind, attempt, detail)
SELECT id, ms, 'succeeded', attempt, 'exit 0' FROM u";

/// A `__bare_batch_cycles` child: as [`bare_cycles_child`], [`BATCH`] jobs a statement
/// ([`BARE_CLAIM_BATCH`], [`BARE_FINISH_BATCH`]); a cycle is still one job.
fn bare_batch_cycles_child(db: &str, secs: Duration, worker: &str) {
    let mut c = Client::connect(db, NoTls).expect("the bench database connects");
    let claim_sql = c.prepare(BARE_CLAIM_BATCH).expect("the claim prepares");
    let finish_sql = c.prepare(BARE_FINISH_BATCH).expect("the finish prepares");
    println!("ready");
    read_stdin_line();
    let cpu0 = cpu_time();
    let t = Instant::now();
    let (mut n, mut claim, mut finish, mut dry) = (0u64, Duration::ZERO, Duration::ZERO, false);
    while t.elapsed() < secs {
        let c0 = Instant::now();
        let rows = c.query(&claim_sql, &[&worker, &BATCH]).expect("claim");
        if rows.is_empty() {
            dry = true;
            break;
        }
        let ids: Vec<i64> = rows.iter().map(|r| r.get(0)).collect();
        let tokens: Vec<String> = rows.iter().map(|r| r.get(1)).collect();
        let c1 = Instant::now();
        let done = c.execute(&finish_sql, &[&ids, &tokens]).expect("finish");
        assert_eq!(
            done,
            ids.len() as u64,
            "the bare finish records every success"
        );
        claim += c1 - c0;
        finish += c1.elapsed();
        n += ids.len() as u64;
    }
    let elapsed = t.elapsed();
    let cpu = cpu_time().saturating_sub(cpu0);
    println!(
        "done {n} {} {} {} {} {}",
        elapsed.as_nanos(),
        claim.as_nanos(),
        finish.as_nanos(),
        cpu.as_nanos(),
        u8::from(dry)
    );
    read_stdin_line();
}

/// A `__bare_cycles` child: as [`cycles_child`], with a plain client sending [`BARE_CLAIM`]
/// and [`BARE_FINISH`] (two statements, two round trips, two commits a cycle).
fn bare_cycles_child(db: &str, secs: Duration, worker: &str) {
    let mut c = Client::connect(db, NoTls).expect("the bench database connects");
    let claim_sql = c.prepare(BARE_CLAIM).expect("the bare claim prepares");
    let finish_sql = c.prepare(BARE_FINISH).expect("the bare finish prepares");
    println!("ready");
    read_stdin_line();
    let cpu0 = cpu_time();
    let t = Instant::now();
    let (mut n, mut claim, mut finish, mut dry) = (0u64, Duration::ZERO, Duration::ZERO, false);
    while t.elapsed() < secs {
        let c0 = Instant::now();
        let Some(row) = c.query_opt(&claim_sql, &[&worker]).expect("claim") else {
            dry = true;
            break;
        };
        let (id, token): (i64, String) = (row.get(0), row.get(1));
        let c1 = Instant::now();
        let done = c.execute(&finish_sql, &[&id, &token]).expect("finish");
        assert_eq!(done, 1, "the bare finish records the success");
        claim += c1 - c0;
        finish += c1.elapsed();
        n += 1;
    }
    let elapsed = t.elapsed();
    let cpu = cpu_time().saturating_sub(cpu0);
    println!(
        "done {n} {} {} {} {} {}",
        elapsed.as_nanos(),
        claim.as_nanos(),
        finish.as_nanos(),
        cpu.as_nanos(),
        u8::from(dry)
    );
    read_stdin_line();
}

/// An `__enqueue` child: opens its own Store, says `ready`, then enqueues a job that writes a
/// marker into `fifo` for each line it reads, answering with the job's id, until its stdin
/// closes.
fn enqueue_child(db: &str, fifo: &str) {
    let store = Store::open(db).expect("the bench database opens");
    let job = Job::command(marker_command(fifo));
    println!("ready");
    while !read_stdin_line().is_empty() {
        let id = store.enqueue(&job).expect("the job is enqueued");
        println!("{id}");
    }
}

/// A `__runner` child: a runner with the defaults on `db`; says `ready` once started, and
/// shuts down when its stdin closes.
fn runner_child(db: &str) {
    // Errors only, unless RUST_LOG says more.
    let _ = env_logger::try_init();
    let runner = Runner::builder(db).start().expect("the runner starts");
    println!("ready");
    read_stdin_line();
    runner.shutdown().expect("the runner shuts down");
}

// ---------------------------------------------------------------------------------------------
// Small helpers

fn mid(mut v: Vec<f64>) -> f64 {
    mid_in_place(&mut v)
}

fn mid_in_place(v: &mut [f64]) -> f64 {
    if v.is_empty() {
        return f64::NAN;
    }
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

fn listed(v: &[f64]) -> String {
    let each: Vec<String> = v.iter().map(|r| format!("{r:.2}")).collect();
    each.join(", ")
}

/// `url` with its database (the path) replaced by `database`; its query string is kept.
fn with_database(url: &str, database: &str) -> String {
    let (base, query) = match url.split_once('?') {
        Some((base, query)) => (base, Some(query)),
        None => (url, None),
    };
    let authority_at = base.find("://").map_or(0, |i| i + 3);
    let server = match base[authority_at..].find('/') {
        Some(slash) => &base[..authority_at + slash],
        None => base,
    };
    match query {
        Some(query) => format!("{server}/{database}?{query}"),
        None => format!("{server}/{database}"),
    }
}

/// `url` without a password.
fn redact(url: &str) -> String {
    let Some(at) = url.find('@') else {
        return url.to_string();
    };
    let start = url.find("://").map_or(0, |i| i + 3);
    match url[start..at].find(':') {
        Some(colon) => format!("{}:***{}", &url[..start + colon], &url[at..]),
        None => url.to_string(),
    }
}
