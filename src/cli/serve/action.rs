//! The dashboard's only writes: retry and cancel, by POST, when `--allow-actions` is on and the
//! form carries this process's CSRF token.

use leasehold::{Error, Store, operator};

use super::auth::same;
use super::http::{self, Response};
use super::{App, error_page};

/// Retries or cancels job `id` (as `jobs retry` and `jobs cancel` do, processes torn down at
/// once), then sends the browser back to the job's page.
pub fn post(
    store: &Store,
    app: &App,
    id: &str,
    verb: &str,
    body: &[u8],
) -> Result<Response, Error> {
    let Some(token) = app.token.as_deref() else {
        return Ok(error_page(
            403,
            "actions are off: start `leasehold serve` with --allow-actions",
        ));
    };
    let form = std::str::from_utf8(body).ok().and_then(http::parse_pairs);
    let sent = form
        .as_ref()
        .and_then(|f| f.iter().find(|(k, _)| k == "csrf").map(|(_, v)| v.as_str()));
    if !sent.is_some_and(|s| same(s.as_bytes(), token.as_bytes())) {
        return Ok(error_page(
            403,
            "missing or wrong CSRF token: use the button on the job's page",
        ));
    }
    let Ok(id) = id.parse::<i64>() else {
        return Ok(error_page(400, "a job id is a whole number"));
    };
    match verb {
        "retry" => {
            operator::retry(store, id, Some("retried from the dashboard"))?;
        }
        _ => {
            operator::cancel(store, id)?;
        }
    }
    log::info!("serve: job {id}: {verb} from the dashboard");
    Ok(Response::see_other(format!("/jobs/{id}")))
}
