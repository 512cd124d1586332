//! A `.pgpass` file's text, asked for the password of a connection.
#![no_main]
use arbitrary::Arbitrary;
use libfuzzer_sys::fuzz_target;

#[derive(Debug, Arbitrary)]
struct Input<'a> {
    host: &'a str,
    port: u16,
    dbname: &'a str,
    user: &'a str,
    text: &'a str,
}

fuzz_target!(|input: Input<'_>| {
    let found =
        leasehold::fuzzing::pgpass(input.text, input.host, input.port, input.dbname, input.user);
    if let Some(password) = found {
        // The password is a field of the file: never longer than its text.
        assert!(password.len() <= input.text.len());
    }
});
