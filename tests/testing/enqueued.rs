//! Assertions on what an application enqueued, and what they print when they fail.

use std::panic::{AssertUnwindSafe, catch_unwind};

use leasehold::Job;
use leasehold::testing::{Expected, TestDb};

/// The message of the panic `f` raises.
fn panic_message(f: impl FnOnce()) -> String {
    let e = catch_unwind(AssertUnwindSafe(f)).expect_err("the assertion fails");
    e.downcast_ref::<String>()
        .cloned()
        .or_else(|| e.downcast_ref::<&str>().map(|s| s.to_string()))
        .unwrap_or_default()
}

#[test]
fn each_setting_an_application_sets_can_be_matched() {
    let db = TestDb::new();
    let store = db.store();
    let first = store.enqueue(&Job::shell("true")).unwrap();
    let id = store
        .enqueue(
            &Job::command(["mail", "--to", "a@example.com"])
                .queue("mail")
                .priority(5)
                .unique_key("mail:a")
                .env("LANG", "C")
                .name("mail a")
                .after([first]),
        )
        .unwrap();
    let due = db.clock().now_ms();
    let found = db.assert_enqueued(
        &Expected::command(["mail", "--to", "a@example.com"])
            .queue("mail")
            .priority(5)
            .unique_key("mail:a")
            .env("LANG", "C")
            .name("mail a")
            .after([first])
            .due_at(due),
    );
    assert_eq!(found.id, id);
    assert_eq!(db.enqueued().len(), 2);
    db.assert_enqueued_times(&Expected::any(), 2);
    db.refute_enqueued(&Expected::command(["mail"]));
    db.refute_enqueued(&Expected::any().queue("mail").priority(4));
    db.refute_enqueued(&Expected::any().name("mail b"));
}

#[test]
fn a_failed_assertion_lists_what_was_enqueued_and_how_it_differs() {
    let db = TestDb::new();
    db.store()
        .enqueue(&Job::command(["backup"]).queue("io").unique_key("backup"))
        .unwrap();
    let message =
        panic_message(|| drop(db.assert_enqueued(&Expected::command(["backup"]).queue("cpu"))));
    assert!(
        message.starts_with("no enqueued job matches\n"),
        "{message}"
    );
    assert!(
        message.contains("expected: command [\"backup\"], queue \"cpu\""),
        "{message}"
    );
    assert!(
        message.contains("≠ job 1: command [\"backup\"], queue \"io\""),
        "{message}"
    );
    assert!(message.contains("differs in queue: \"io\""), "{message}");
    assert!(!message.contains("differs in command"), "{message}");

    let message = panic_message(|| db.refute_enqueued(&Expected::command(["backup"])));
    assert!(
        message.contains("found: job 1: command [\"backup\"]"),
        "{message}"
    );

    let empty = TestDb::new();
    let message = panic_message(|| drop(empty.assert_enqueued(&Expected::any())));
    assert!(message.contains("enqueued: nothing"), "{message}");
}

#[test]
fn a_test_database_is_removed_on_drop() {
    let db = TestDb::new();
    let folder = db.path().parent().unwrap().to_path_buf();
    db.store().enqueue(&Job::shell("true")).unwrap();
    assert!(folder.exists());
    drop(db);
    assert!(!folder.exists());
}
