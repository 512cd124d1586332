//! The notifier thread: tails the endings in the database and tells callbacks, subscribers
//! and waiters.

use crossbeam_channel::{Receiver, Sender};
use parking_lot::Mutex;

use crate::job::{ErrorKind, Event, EventKind, Outcome, Status};
use crate::store::Store;

use super::builder::{Callback, Completion};
use super::shared::{Shared, panic_message};

/// How long a notifier with nobody to tell sleeps at most between looks at its subscribers.
const IDLE_BACKSTOP: std::time::Duration = std::time::Duration::from_secs(10);

/// How many endings a subscriber's channel holds unread. A subscriber that falls this far
/// behind is dropped (its receiver sees the channel close once it has read what it holds)
/// rather than let the runner's memory grow without bound.
pub(super) const SUBSCRIBER_CAPACITY: usize = 10_000;

/// A channel that receives every ending after the event `from` (when known).
pub(super) struct Subscriber {
    pub tx: Sender<Completion>,
    pub from: Option<i64>,
}

/// Tails the endings in the database and tells callbacks, subscribers and waiters.
pub(super) fn notify_loop(
    store: &Store,
    shared: &Shared,
    stop: &Receiver<()>,
    subscribers: &Mutex<Vec<Subscriber>>,
    callbacks: &[Callback],
    last_event: i64,
) {
    let mut seen = shared.endings_seen();
    // The last event read, while someone listens; None while nobody does.
    let mut tail = Some(last_event);
    loop {
        shared.test_hook("notifier");
        // With nobody to tell, reading the endings would only cost: this runner's own endings
        // wake its waiters directly, and a wait polls for other processes' endings. An idle
        // runner's notifier thus touches no database; a subscriber brings its own starting
        // point (the last event when it subscribed), so nothing is missed meanwhile.
        let listening = !callbacks.is_empty() || !subscribers.lock().is_empty();
        if !listening {
            tail = None;
            if matches!(
                stop.try_recv(),
                Err(crossbeam_channel::TryRecvError::Disconnected)
            ) {
                return;
            }
            // A new subscriber and the shutdown both signal the endings (see
            // `Runner::subscribe` and `Runner::shutdown_within`); the timeout is a backstop.
            seen = shared.wait_for_endings(seen, IDLE_BACKSTOP);
            continue;
        }
        let last = match tail {
            Some(last) => last,
            None => {
                let from = subscribers.lock().iter().filter_map(|s| s.from).min();
                match from.map_or_else(|| store.last_event_id(), Ok) {
                    Ok(last) => last,
                    Err(e) => {
                        shared.stop_if_damaged("notifier", &e);
                        log::warn!("notifier: cannot read events: {e:#}");
                        seen = shared.wait_for_endings(seen, shared.config.poll_interval);
                        continue;
                    }
                }
            }
        };
        tail = Some(last);
        let stopping = matches!(
            stop.try_recv(),
            Err(crossbeam_channel::TryRecvError::Disconnected)
        );
        match store.endings_after(last, 1000) {
            Ok(events) => {
                let any = !events.is_empty();
                for e in events {
                    tail = Some(e.id);
                    let completion = completion(store, &e);
                    for cb in callbacks {
                        // A caller's callback that panics is the caller's bug, not the
                        // runner's: log it and go on telling the others.
                        let told = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                            cb(&completion);
                        }));
                        if let Err(panic) = told {
                            log::error!(
                                "an on_complete callback panicked on job {}: {}",
                                completion.job_id,
                                panic_message(panic.as_ref())
                            );
                        }
                    }
                    subscribers.lock().retain(|s| {
                        if s.from.is_some_and(|from| e.id <= from) {
                            return true;
                        }
                        match s.tx.try_send(completion.clone()) {
                            Ok(()) => true,
                            Err(crossbeam_channel::TrySendError::Full(_)) => {
                                log::warn!(
                                    "a subscriber left {} endings unread: dropping it (its \
                                     channel closes)",
                                    s.tx.capacity().unwrap_or(0)
                                );
                                false
                            }
                            Err(crossbeam_channel::TrySendError::Disconnected(_)) => false,
                        }
                    });
                }
                if any {
                    shared.endings_changed();
                    seen = shared.endings_seen();
                    continue;
                }
            }
            Err(e) if shared.stop_if_damaged("notifier", &e) => {}
            Err(e) => log::warn!("notifier: cannot read events: {e:#}"),
        }
        if stopping {
            return;
        }
        seen = shared.wait_for_endings(seen, shared.config.poll_interval);
    }
}

fn completion(store: &Store, e: &Event) -> Completion {
    let outcome = match e.kind {
        EventKind::Succeeded => Outcome::Succeeded,
        EventKind::Cancelled => Outcome::Cancelled,
        kind => {
            let detail = e.detail.clone().unwrap_or_default();
            // Only a failure needs the row (its exit code, signal and kind). It may have
            // moved on since (an operator retried it): take the columns only while they
            // still describe this ending.
            let job = store.job(e.job_id).ok();
            let same = job
                .as_ref()
                .filter(|j| j.attempt == e.attempt && j.status == Status::Failed);
            Outcome::Failed {
                kind: same
                    .and_then(|j| j.error_kind)
                    .unwrap_or(if kind == EventKind::Lost {
                        ErrorKind::Lost
                    } else {
                        ErrorKind::Exit
                    }),
                exit_code: same.and_then(|j| j.exit_code),
                signal: same.and_then(|j| j.signal),
                message: detail,
            }
        }
    };
    Completion {
        job_id: e.job_id,
        attempt: e.attempt,
        outcome,
    }
}
