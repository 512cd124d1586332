//! Renewals: a worker extends its own leases in one call and learns which it lost.

use leasehold::Job;

use crate::helper::{TTL, TTL_MS, claim, claim_one, enqueue, sweep};
use crate::util::{T0, TestDb};

#[test]
fn renew_extends_a_workers_leases_in_one_call_and_reports_the_lost_ones() {
    let db = TestDb::new();
    let store = db.store();
    let ids = store
        .enqueue_many_at(&vec![Job::shell("true"); 4], T0)
        .unwrap();
    let held = claim(&store, "w", 4, T0);
    let tokens: Vec<String> = held.iter().map(|c| c.run_token.clone()).collect();
    store.cancel_at(ids[1], T0 + 1).unwrap();
    // Lose the last one to a sweeper: expire it by hand, as a runner asleep past its TTL.
    db.bare()
        .execute(
            "UPDATE jobs SET lease_expires_at = ?2 WHERE id = ?1",
            [ids[3], T0],
        )
        .unwrap();
    assert_eq!(
        store
            .reclaim(&sweep(3, 10), T0 + 2)
            .unwrap()
            .reclaimed
            .len(),
        1
    );

    let now = T0 + 10_000;
    let renewal = store.renew("w", &tokens, TTL, now).unwrap();
    assert_eq!(renewal.renewed, [tokens[0].clone(), tokens[2].clone()]);
    assert_eq!(renewal.lost, [tokens[1].clone(), tokens[3].clone()]);
    for id in [ids[0], ids[2]] {
        let job = store.job(id).unwrap();
        assert_eq!(job.lease_expires_at, Some(now + TTL_MS));
        assert_eq!(job.heartbeat_at, Some(now));
    }
    assert!(store.renew("w", &[], TTL, now).unwrap().renewed.is_empty());
}

crate::on_both! {
    fn renew_never_renews_another_workers_token(db) {
        let store = db.store();
        let id = enqueue(&store, &Job::shell("true"));
        let theirs = claim_one(&store, "them", T0);
        let renewal = store
            .renew(
                "me",
                std::slice::from_ref(&theirs.run_token),
                TTL,
                T0 + 5000,
            )
            .unwrap();
        assert!(renewal.renewed.is_empty());
        assert_eq!(renewal.lost, [theirs.run_token]);
        assert_eq!(store.job(id).unwrap().lease_expires_at, Some(T0 + TTL_MS));
    }
}
