//! Limits stored in the file hold across runner processes: two `leasehold run` processes
//! on one file never run more of a limited queue together than its limit.

use std::time::Duration;

use leasehold::Status;

use crate::helper::Case;
use crate::util::{max_overlap, spans, timed};

#[test]
fn a_queue_limit_holds_across_two_runner_processes() {
    let mut case = Case::new();
    let times = case.db.sibling("times");
    std::fs::create_dir(&times).unwrap();
    let store = case.store();
    store.set_queue_limit("media", Some(2)).unwrap();
    let media = store
        .enqueue_many(&vec![timed(&times, "0.3").queue("media"); 16])
        .unwrap();
    let other = store.enqueue_many(&vec![timed(&times, "0.3"); 8]).unwrap();
    // Each runner alone has workers enough to run the whole limited queue at once.
    for _ in 0..2 {
        case.start_runner(&["--workers", "4", "--until-idle"]);
    }
    for runner in &mut case.runners {
        let (code, log) = runner.wait(Duration::from_secs(60));
        assert_eq!(code, Some(0), "{log}");
    }
    for &id in media.iter().chain(&other) {
        assert_eq!(case.job(id).status, Status::Succeeded, "job {id}");
    }
    // Both processes took part: the limit was shared, not held by one runner alone.
    let workers: std::collections::HashSet<String> = media
        .iter()
        .chain(&other)
        .filter_map(|&id| case.job(id).worker_id)
        .collect();
    let overlap = max_overlap(&spans(&times, &media));
    assert_eq!(
        overlap, 2,
        "the limited queue ran at its limit, not over it"
    );
    assert_eq!(workers.len(), 2, "{workers:?}");
}
