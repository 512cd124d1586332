//! Embeds leasehold: enqueues three real commands (one succeeds, one fails, one times out),
//! runs them on a runner, and prints each outcome.
//!
//! `cargo run --example quickstart [PATH]` (by default a database in a temporary folder).

use std::time::Duration;

use leasehold::{Job, Outcome, Runner};

fn main() -> Result<(), Box<dyn std::error::Error>> {
    env_logger::Builder::from_env(env_logger::Env::default().default_filter_or("info")).init();
    let dir = std::env::temp_dir().join(format!("leasehold-quickstart-{}", std::process::id()));
    std::fs::create_dir_all(&dir)?;
    let path = std::env::args()
        .nth(1)
        .map(Into::into)
        .unwrap_or_else(|| dir.join("quickstart.db"));

    let runner = Runner::builder(&path)
        .workers(3)
        .kill_grace(Duration::from_secs(1))
        .start()?;
    let jobs = [
        ("succeeds", Job::shell("echo hello from $LEASEHOLD_JOB_ID")),
        ("fails", Job::command(["sh", "-c", "echo oops >&2; exit 3"])),
        (
            "times out",
            Job::shell("sleep 30").timeout(Duration::from_secs(1)),
        ),
    ];
    for (name, job) in &jobs {
        let id = runner.enqueue(job)?;
        let outcome = runner.wait(id, Duration::from_secs(30))?;
        let output = leasehold::Store::open(&path)?.output(id, None)?;
        let stdout = output
            .as_ref()
            .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_string())
            .unwrap_or_default();
        match outcome {
            Some(Outcome::Succeeded) => println!("job {id} ({name}): succeeded: {stdout}"),
            Some(Outcome::Failed { kind, message, .. }) => {
                println!("job {id} ({name}): failed ({kind}): {message}")
            }
            Some(Outcome::Cancelled) => println!("job {id} ({name}): cancelled"),
            None => println!("job {id} ({name}): still running after 30s"),
        }
    }
    runner.shutdown()?;
    println!("database: {}", path.display());
    Ok(())
}
