//! The store's clock: the time every method of a [`Store`](crate::Store) acts at unless it is
//! handed one (the `_at` methods, and the runner's steps, which read it once for several).
//!
//! A store reads the system's clock, unless it was opened with a [`ManualClock`]'s
//! ([`OpenOptions::clock`](crate::OpenOptions::clock)), which moves only when a test moves it.
//! The choice is made once, when the store is opened: reading the system's clock costs one
//! branch on a field, and no global is read on any call.

use std::sync::Arc;
use std::sync::atomic::{AtomicI64, Ordering};
use std::time::Duration;

/// Where a store reads the time: the system's clock (the default) or a [`ManualClock`].
///
/// Cheap to clone: a manual clock's clones share its time.
#[derive(Clone, Debug, Default)]
pub struct Clock {
    manual: Option<Arc<AtomicI64>>,
}

impl Clock {
    /// The system's clock: [`now_ms`](crate::now_ms).
    pub fn system() -> Clock {
        Clock::default()
    }

    /// Milliseconds since the Unix epoch, UTC, on this clock.
    pub fn now_ms(&self) -> i64 {
        match &self.manual {
            None => crate::job::now_ms(),
            Some(ms) => ms.load(Ordering::SeqCst),
        }
    }

    /// Whether this is a [`ManualClock`]'s.
    pub fn is_manual(&self) -> bool {
        self.manual.is_some()
    }
}

/// A clock that moves only when told: every store and runner opened with it
/// ([`OpenOptions::clock`](crate::OpenOptions::clock),
/// [`RunnerBuilder::clock`](crate::RunnerBuilder::clock)) acts at its time, so a test moves due times,
/// delays, backoff, unique windows, schedules, retention and lease expiry without waiting.
/// See docs/testing.md for what cannot follow it (a command's own sleep).
///
/// ```
/// use std::time::Duration;
/// use leasehold::ManualClock;
///
/// let clock = ManualClock::new(1_000);
/// clock.advance(Duration::from_secs(2));
/// assert_eq!(clock.now_ms(), 3_000);
/// clock.set(10);
/// assert_eq!(clock.clock().now_ms(), 10);
/// ```
#[derive(Clone, Debug)]
pub struct ManualClock {
    ms: Arc<AtomicI64>,
}

impl ManualClock {
    /// A clock standing at `start_ms` (milliseconds since the Unix epoch, UTC).
    pub fn new(start_ms: i64) -> ManualClock {
        ManualClock {
            ms: Arc::new(AtomicI64::new(start_ms)),
        }
    }

    /// A clock standing at the system's time now.
    pub fn starting_now() -> ManualClock {
        ManualClock::new(crate::job::now_ms())
    }

    /// Its time, in milliseconds since the Unix epoch, UTC.
    pub fn now_ms(&self) -> i64 {
        self.ms.load(Ordering::SeqCst)
    }

    /// Moves it forward by `by` (whole milliseconds, rounded up).
    pub fn advance(&self, by: Duration) {
        let by = crate::job::duration_ms(by);
        self.ms
            .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |ms| {
                Some(ms.saturating_add(by))
            })
            .ok();
    }

    /// Sets it to `ms` (milliseconds since the Unix epoch, UTC), forward or back.
    pub fn set(&self, ms: i64) {
        self.ms.store(ms, Ordering::SeqCst);
    }

    /// The [`Clock`] a store reads it through, to pass to
    /// [`OpenOptions::clock`](crate::OpenOptions::clock).
    pub fn clock(&self) -> Clock {
        Clock {
            manual: Some(Arc::clone(&self.ms)),
        }
    }
}

impl From<&ManualClock> for Clock {
    fn from(manual: &ManualClock) -> Clock {
        manual.clock()
    }
}

#[cfg(feature = "testing")]
pub(crate) use registry::{register_test_clock, registered_clock, unregister_test_clock};

/// The clocks of `leasehold::testing`'s test databases, which a store opened on one reads
/// (see [`Store::open_with`](crate::Store::open_with)).
#[cfg(feature = "testing")]
mod registry {
    use std::path::{Path, PathBuf};

    use parking_lot::Mutex;

    use super::Clock;

    /// The clocks of the live test databases, by the canonical path of each database's folder and
    /// its file name.
    static CLOCKS: Mutex<Vec<(PathBuf, Clock)>> = Mutex::new(Vec::new());

    /// The clock of the test database at `path`, if it is one.
    pub(crate) fn registered_clock(path: &Path) -> Option<Clock> {
        let clocks = CLOCKS.lock();
        if clocks.is_empty() {
            return None;
        }
        let key = canonical(path)?;
        clocks
            .iter()
            .find(|(p, _)| *p == key)
            .map(|(_, c)| c.clone())
    }

    /// `path` with its folder made canonical, or `None` when the folder does not exist.
    fn canonical(path: &Path) -> Option<PathBuf> {
        let name = path.file_name()?;
        let folder = match path.parent() {
            Some(p) if !p.as_os_str().is_empty() => p,
            _ => Path::new("."),
        };
        Some(std::fs::canonicalize(folder).ok()?.join(name))
    }

    /// Registers the clock of the test database at `path` (a canonical path).
    pub(crate) fn register_test_clock(path: &Path, clock: Clock) {
        CLOCKS.lock().push((path.to_path_buf(), clock));
    }

    /// Forgets the clock of the test database at `path`.
    pub(crate) fn unregister_test_clock(path: &Path) {
        CLOCKS.lock().retain(|(p, _)| p != path);
    }
}
