//! `leasehold queues ...`: limit, pause, resume, ls. The settings are stored in the file, so
//! they hold for every runner and process on it.

use std::io::Write;
use std::path::Path;

use leasehold::QueueInfo;
use serde_json::{Value, json};

use super::arg::QueueLimit;
use super::render::{self, print_json};
use super::{open_existing, open_read_only};

pub fn limit(db: &Path, name: &str, limit: QueueLimit, json: bool) -> anyhow::Result<()> {
    let store = open_existing(db)?;
    store.set_queue_limit(name, limit.0)?;
    let mut out = std::io::stdout().lock();
    if json {
        print_json(&mut out, &json!({"queue": name, "limit": limit.0}))?;
    } else {
        match limit.0 {
            Some(n) => writeln!(out, "queue {name}: at most {n} running at once")?,
            None => writeln!(out, "queue {name}: no limit")?,
        }
    }
    Ok(())
}

pub fn pause(db: &Path, name: &str, paused: bool, json: bool) -> anyhow::Result<()> {
    let store = open_existing(db)?;
    if paused {
        store.pause_queue(name)?;
    } else {
        store.resume_queue(name)?;
    }
    let mut out = std::io::stdout().lock();
    if json {
        print_json(&mut out, &json!({"queue": name, "paused": paused}))?;
    } else if paused {
        writeln!(out, "queue {name}: paused (running jobs finish)")?;
    } else {
        writeln!(out, "queue {name}: resumed")?;
    }
    Ok(())
}

pub fn ls(db: &Path, json: bool) -> anyhow::Result<()> {
    let store = open_read_only(db)?;
    let queues = store.queues()?;
    let mut out = std::io::BufWriter::new(std::io::stdout().lock());
    if json {
        let all: Vec<Value> = queues.iter().map(queue_json).collect();
        print_json(&mut out, &Value::Array(all))?;
    } else {
        let mut rows = vec![
            [
                "QUEUE",
                "PENDING",
                "WAITING",
                "RUNNING",
                "LIMIT",
                "PAUSED",
                "OLDEST READY",
            ]
            .map(String::from)
            .to_vec(),
        ];
        for q in &queues {
            rows.push(vec![
                q.name.clone(),
                q.pending.to_string(),
                q.waiting.to_string(),
                q.running.to_string(),
                q.limit.map_or_else(|| "-".into(), |l| l.to_string()),
                if q.paused { "yes" } else { "no" }.into(),
                q.oldest_ready_ms
                    .map_or_else(|| "-".into(), |ms| format!("{:.1}s", ms as f64 / 1000.0)),
            ]);
        }
        render::table(&mut out, &rows)?;
    }
    out.flush()?;
    Ok(())
}

fn queue_json(q: &QueueInfo) -> Value {
    json!({
        "name": q.name,
        "pending": q.pending,
        "waiting": q.waiting,
        "running": q.running,
        "limit": q.limit,
        "paused": q.paused,
        "oldest_ready_ms": q.oldest_ready_ms,
    })
}
