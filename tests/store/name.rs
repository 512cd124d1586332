//! A job's name (schema version 17): stored, read back, carried by a schedule's template and a
//! bulk enqueue, and refused when empty.

use std::time::Duration;

use leasehold::{Error, Job, Schedule};

use crate::util::T0;

crate::on_both! {
    fn a_jobs_name_is_stored_and_read_back(db) {
        let store = db.store();
        let named = store.enqueue_at(&Job::shell("true").name("unit: parser"), T0).unwrap();
        let unnamed = store.enqueue_at(&Job::shell("true"), T0).unwrap();
        assert_eq!(store.job(named).unwrap().name.as_deref(), Some("unit: parser"));
        assert_eq!(store.job(unnamed).unwrap().name, None);
        let many = store
            .enqueue_many_at(&[Job::shell("true").name("a"), Job::shell("true").name("b")], T0)
            .unwrap();
        let names: Vec<Option<String>> =
            many.iter().map(|&id| store.job(id).unwrap().name).collect();
        assert_eq!(names, [Some("a".into()), Some("b".into())]);
    }

    fn a_schedules_jobs_carry_its_templates_name(db) {
        let store = db.store();
        let every = Schedule::every(Duration::from_secs(60)).job(Job::shell("true").name("tick"));
        store.put_schedule_at("tick", &every, T0).unwrap();
        let fired = store.fire_due_at(T0 + 60_000).unwrap();
        assert_eq!(fired.enqueued, 1);
        let job = store.list(&Default::default()).unwrap().remove(0);
        assert_eq!(job.name.as_deref(), Some("tick"));
    }

    fn an_empty_name_is_refused(db) {
        let store = db.store();
        match store.enqueue_at(&Job::shell("true").name(""), T0) {
            Err(Error::Invalid { setting, .. }) => assert_eq!(setting, "name"),
            other => panic!("{other:?}"),
        }
    }
}
