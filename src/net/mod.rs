//! The HTTP transport under fetch and registry: one rule for what is worth another try,
//! one retrying sender, and one resumable body reader. Auth is not here: fetch adds an
//! index's basic credentials and registry its challenges and tokens on top, per attempt.
//! Depends on std, reqwest and tokio only; it knows no index, registry or blob store.
//!
//! # The rule
//!
//! Transient (tried again, up to [`RetryPolicy::max_attempts`] attempts in all):
//! - the statuses 408, 429, 500, 502, 503 and 504. A `Retry-After` in seconds is waited
//!   instead of the backoff, capped at [`RetryPolicy::max_backoff`];
//! - a timeout, a connection reset, aborted or closed early, a body cut short;
//! - a failure to connect to an origin that has answered this transport before (a server
//!   restarting). A failure to connect to an origin that never answered (connection
//!   refused, a name that does not resolve, TLS to a plain-http server) is final at once:
//!   waiting does not make something listen there.
//!
//! Not transient, answered at once: every other status (401 and 403 go to the auth layer
//! above, 404 and 410 mean absent, 416 is for a resumed read to judge, 501 and 505 will
//! not change), and every failure that is not the network's: a body that does not decode,
//! a digest or size mismatch (those are judged above this module, never retried here).
//!
//! Backoff: `initial_backoff * 2^(retry - 1)`, capped at `max_backoff`, without jitter
//! (cudastack's requests are few and serial per transfer; a fixed schedule keeps tests
//! and logs exact). A read that moved bytes forward since its last failure starts its
//! count again, so a long transfer over a flaky link finishes.
//!
//! Every retry is one `warn` line on stderr (shown unless `--quiet`), in one form:
//! ``retrying GET `URL` in 500ms (attempt 2 of 5): HTTP 503 Service Unavailable``.
//! URLs are shown without userinfo ([`redacted`]).

mod resume;
mod retry;
mod transport;

pub use resume::{range_headers, ContentRange, Piece, ReadError, ResumableBody};
pub use retry::{
    error_chain, is_transient, is_transient_status, redacted, retry_after, Attempts, Failure,
    Redacted, RetryPolicy,
};
pub use transport::{attempts_note, client_builder, NetError, Sent, Transport};
