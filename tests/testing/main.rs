//! `leasehold::testing` as an application's tests use it: the public API only, on the test
//! clock, without real waiting for anything the clock governs.

mod app;
mod clock;
mod drain;
mod enqueued;
