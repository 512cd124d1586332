//! Maintenance by one runner at a time: the lead of a role is held until it expires unless
//! renewed, and the work stays right when two do it at once.

use std::sync::{Arc, Barrier};
use std::thread;
use std::time::Duration;

use leasehold::{Job, OpenOptions, PruneOptions, Retention, Store};

use crate::util::T0;

const TTL: Duration = Duration::from_secs(10);

crate::on_both! {
    /// On PostgreSQL one holder leads until its lead expires unrenewed, and then another
    /// takes it; on SQLite, whose one writer serialises its runners, everyone leads.
    fn one_runner_leads_a_role_until_its_lead_expires(db) {
        let (a, b) = (db.store(), db.store());
        let pg = db.is_postgres();
        assert!(a.lead("prune", "a", TTL, T0).unwrap());
        assert_eq!(b.lead("prune", "b", TTL, T0 + 1).unwrap(), !pg, "b waits on PostgreSQL");
        // Renewed by its holder, the lead lasts from the renewal.
        assert!(a.lead("prune", "a", TTL, T0 + 9_000).unwrap());
        assert_eq!(b.lead("prune", "b", TTL, T0 + 12_000).unwrap(), !pg);
        // Another role is led apart.
        assert!(b.lead("vacuum", "b", TTL, T0 + 12_000).unwrap());
        // Not renewed in time: b takes it, and a no longer leads.
        assert!(b.lead("prune", "b", TTL, T0 + 19_001).unwrap());
        assert_eq!(a.lead("prune", "a", TTL, T0 + 19_002).unwrap(), !pg);
        if pg {
            assert_eq!(
                db.scalar("SELECT count(*) FROM leaders WHERE role = 'prune' AND holder = 'b'"),
                1
            );
        }
    }

    /// Two connections prune the same finished jobs at once, in small batches (a lead taken
    /// over while its holder still prunes): every job goes once, and neither fails.
    fn two_prunes_at_once_remove_each_job_once(db) {
        const N: usize = 300;
        let store = db.store();
        let ids = store.enqueue_many_at(&vec![Job::shell("true"); N], T0).unwrap();
        for &id in &ids {
            store.cancel_at(id, T0).unwrap();
        }
        let barrier = Arc::new(Barrier::new(2));
        let threads: Vec<_> = (0..2)
            .map(|_| {
                let (target, barrier) = (db.target(), Arc::clone(&barrier));
                thread::spawn(move || {
                    let store =
                        Store::open_with(target, &OpenOptions::default().given_times(true))
                            .unwrap();
                    barrier.wait();
                    let options = PruneOptions::default().batch(7);
                    let policy = Retention::keep_all().keep_max(Some(0));
                    store.prune_at(&policy, &options, T0 + 1).unwrap().jobs
                })
            })
            .collect();
        let pruned: u64 = threads
            .into_iter()
            .map(|t| t.join().expect("a pruning thread does not panic"))
            .sum();
        assert_eq!(pruned, N as u64, "each job pruned once, by one of the two");
        assert_eq!(db.scalar("SELECT count(*) FROM jobs"), 0);
        assert_eq!(db.scalar("SELECT count(*) FROM job_events"), 0);
        assert_eq!(store.counts().unwrap().cancelled, 0);
    }
}
