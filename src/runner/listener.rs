//! The wake-up listener's thread: pokes from other processes, and the jobs commands hand over.

use std::sync::atomic::Ordering;
use std::time::Duration;

use crossbeam_channel::Sender;

use crate::error::Result;
use crate::store::{Durability, OpenOptions, Store};
use crate::store::{handoff, wake};

use super::builder::Config;
use super::shared::Shared;

/// The wake-up listener's loop: every poke from another process wakes the dispatcher, as an
/// enqueue in this process does, and the schedule firer, which rereads the schedules (another
/// process may have added or resumed one); a job handed over wakes the dispatcher only (a
/// hand-off changes no schedule, and rereading them cost the runner 0.08 ms of CPU a job). Ends when the runner closes the socket at shutdown;
/// a socket that fails before that is logged and removed, so that no command hands a job to
/// a socket nobody reads (the dispatcher's poll still finds the work, and the firer rereads
/// the schedules every second).
pub(super) fn listen(
    mut listener: wake::Listener,
    shared: &Shared,
    firer: &Sender<()>,
    config: &Config,
) {
    // Opened at the first job a command hands over, so that a runner nobody hands jobs to
    // keeps one connection fewer. Always FULL: the command reports the job stored when this
    // answers, as it would after a commit of its own.
    let mut store: Option<Store> = None;
    while let Some(received) = listener.wait() {
        for request in received.requests {
            if shared.shutting_down.load(Ordering::SeqCst) {
                // Declined at once, so the command stores its job itself now rather than
                // after waiting out its deadline.
                let answer = handoff::decline(&request.body, handoff::SHUTTING_DOWN);
                listener.answer(&request.from, &answer);
                continue;
            }
            if store.is_none() {
                store = handoff_store(config, &listener)
                    .map_err(|e| log::warn!("cannot store handed jobs: {e}"))
                    .ok();
            }
            let Some(s) = &store else {
                // The command stores its job itself, with the error it gets, if any.
                let answer = handoff::decline(&request.body, "the runner cannot store it");
                listener.answer(&request.from, &answer);
                continue;
            };
            let (answer, new) = handoff::answer(s, &request.body, s.now());
            listener.answer(&request.from, &answer);
            // Other runners on the file may take it (this one is woken below).
            if new {
                s.poke();
            }
        }
        if shared.shutting_down.load(Ordering::SeqCst) {
            // Drain: requests sent before the runner closes the socket are still queued in
            // it, and are declined above; the wait ends once they are read and the socket
            // is closed.
            continue;
        }
        shared.wake_dispatcher();
        if received.poked {
            // The firer ends only at shutdown; a send to it then is moot.
            let _ = firer.try_send(());
        }
    }
    // Its file removed: commands no longer find it, and pass over to the next runner.
    drop(listener);
    while !shared.shutting_down.load(Ordering::SeqCst) {
        // The socket failed (logged by `wait`): wait for the shutdown.
        shared.wait_for_endings(shared.endings_seen(), Duration::from_secs(60));
    }
}

/// The listener's connection, for jobs that commands hand over (see [`handoff`]).
fn handoff_store(config: &Config, listener: &wake::Listener) -> Result<Store> {
    let mut store = Store::open_with(
        &config.path,
        &OpenOptions::new()
            .create(false)
            .migrate(false)
            .durability(Durability::Full)
            .clock(config.clock.clone()),
    )?;
    store.set_own_socket(Some(listener.path().to_path_buf()));
    Ok(store)
}

/// How long the PostgreSQL listener waits for an announcement before it looks whether the
/// runner is shutting down: the most a shutdown waits for it.
#[cfg(feature = "postgres")]
const LISTEN_STEP: Duration = Duration::from_millis(200);

/// The longest wait between two attempts to listen again after the connection was lost.
#[cfg(feature = "postgres")]
const LISTEN_BACKOFF_MAX: Duration = Duration::from_secs(5);

/// The PostgreSQL runner's wake-up: `LISTEN`s on its own connection and turns each
/// announcement (a `NOTIFY` sent at the commit of an enqueue, a retry or a schedule, from any
/// host) into the wake-up an enqueue in this process gives the dispatcher; a schedule's also
/// wakes the firer. Ends when `stop` is disconnected (the runner's shutdown).
///
/// Nothing depends on an announcement arriving, as with SQLite's pokes: while the connection
/// is down (a server restart, a network cut) the runner works on its poll, and this thread
/// connects again with backoff, then wakes the dispatcher and the firer once, for whatever
/// was announced while nobody listened.
#[cfg(feature = "postgres")]
pub(super) fn listen_postgres(
    config: &Config,
    shared: &Shared,
    firer: &Sender<()>,
    stop: &crossbeam_channel::Receiver<()>,
) {
    use crossbeam_channel::RecvTimeoutError;
    let mut listening = None;
    let mut backoff = Duration::from_millis(100);
    let mut said_lost = false;
    loop {
        if let Err(crossbeam_channel::TryRecvError::Disconnected) = stop.try_recv() {
            return;
        }
        let Some(l) = listening.as_mut() else {
            match crate::store::pg::listen(&config.path) {
                Ok(l) => {
                    if said_lost {
                        log::info!("listening for announcements of new work again");
                        said_lost = false;
                    }
                    listening = Some(l);
                    backoff = Duration::from_millis(100);
                    shared.wake_dispatcher();
                    let _ = firer.try_send(());
                }
                Err(e) => {
                    if !said_lost {
                        log::warn!(
                            "cannot listen for announcements of new work ({e}): new jobs \
                             start on the poll until the database answers again"
                        );
                        said_lost = true;
                    }
                    if let Err(RecvTimeoutError::Disconnected) = stop.recv_timeout(backoff) {
                        return;
                    }
                    backoff = (backoff * 2).min(LISTEN_BACKOFF_MAX);
                }
            }
            continue;
        };
        match l.wait(LISTEN_STEP) {
            Ok(got) if got.is_empty() => {}
            Ok(got) => {
                shared.wake_dispatcher();
                if got.iter().any(|what| what == "schedules") {
                    // The firer ends only at shutdown; a send to it then is moot.
                    let _ = firer.try_send(());
                }
            }
            Err(e) => {
                log::warn!(
                    "the connection that listens for new work was lost ({e}): new jobs start \
                     on the poll until it is back"
                );
                said_lost = true;
                listening = None;
            }
        }
    }
}
