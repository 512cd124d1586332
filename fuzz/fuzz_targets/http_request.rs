//! A request on the dashboard (`leasehold serve`), parsed from what a connection sent so
//! far, in any prefix of it, as the reader gathers it.
#![no_main]
use libfuzzer_sys::fuzz_target;

// The binary's own parser, compiled here as it is there: it uses only std.
#[expect(dead_code, reason = "the fuzz target calls the parser only")]
#[path = "../../src/cli/serve/http.rs"]
mod http;

fuzz_target!(|bytes: &[u8]| {
    let bytes = &bytes[..bytes.len().min(http::MAX_REQUEST)];
    for end in [bytes.len() / 2, bytes.len()] {
        if let Ok(Some(request)) = http::parse_request(&bytes[..end]) {
            assert!(request.body.len() <= http::MAX_BODY);
            assert!(request.target.starts_with('/'));
        }
    }
    if let Ok(text) = std::str::from_utf8(bytes) {
        let _ = http::parse_pairs(text);
        if let Some(decoded) = http::percent_decode(text, true) {
            let again = http::percent_decode(&http::percent_encode(&decoded), false);
            assert_eq!(
                again.as_deref(),
                Some(decoded.as_str()),
                "encode then decode"
            );
        }
    }
});
