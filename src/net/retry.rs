//! The retry rule (the module head says it in words) and [`Attempts`], the one counter,
//! backoff and retry line every retrying loop goes through.

use std::fmt;
use std::time::Duration;

use reqwest::header::{HeaderMap, RETRY_AFTER};
use reqwest::{StatusCode, Url};

/// How hard to try before giving up on a request.
#[derive(Debug, Clone)]
pub struct RetryPolicy {
    /// Total attempts, including the first one.
    pub max_attempts: u32,
    /// Wait before the first retry; doubled for each further retry.
    pub initial_backoff: Duration,
    /// Upper bound on a single wait (also caps `Retry-After`).
    pub max_backoff: Duration,
}

impl Default for RetryPolicy {
    fn default() -> Self {
        RetryPolicy {
            max_attempts: 5,
            initial_backoff: Duration::from_millis(500),
            max_backoff: Duration::from_secs(20),
        }
    }
}

impl RetryPolicy {
    /// One attempt: for requests that must not be sent twice (an upload session's PATCH
    /// and PUT), whose caller resumes on its own terms.
    pub fn once() -> Self {
        RetryPolicy {
            max_attempts: 1,
            ..RetryPolicy::default()
        }
    }

    /// The wait before retry number `retry` (1-based): `initial * 2^(retry-1)`, capped.
    pub fn backoff(&self, retry: u32) -> Duration {
        let factor = 1u32
            .checked_shl(retry.saturating_sub(1))
            .unwrap_or(u32::MAX);
        self.initial_backoff
            .saturating_mul(factor)
            .min(self.max_backoff)
    }

    /// A counter of attempts at `what` (`GET `URL``, `the upload of blob X`).
    pub fn attempts(&self, what: impl fmt::Display) -> Attempts {
        Attempts {
            policy: self.clone(),
            what: what.to_string(),
            made: 0,
        }
    }
}

/// What went wrong with one attempt, as far as the rule cares.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Failure {
    /// The server answered with this status.
    Status(StatusCode),
    /// No connection was made; `answered_before`: the origin answered this transport before.
    Connect { answered_before: bool },
    /// A connect, read or whole-request timeout.
    Timeout,
    /// The connection broke while the request or the body was under way.
    Cut,
    /// Anything else (a body that does not decode, a redirect loop, a bad request).
    Other,
}

impl Failure {
    /// Classify a reqwest error. A body cut short surfaces as a decode or body error
    /// wrapping an I/O error, so the whole source chain is read.
    pub fn of_error(error: &reqwest::Error, answered_before: bool) -> Failure {
        if error.is_connect() {
            return Failure::Connect { answered_before };
        }
        if error.is_timeout() {
            return Failure::Timeout;
        }
        if error.is_request() || error.is_body() {
            return Failure::Cut;
        }
        let mut source = std::error::Error::source(error);
        while let Some(cause) = source {
            if let Some(io_error) = cause.downcast_ref::<std::io::Error>() {
                use std::io::ErrorKind::*;
                match io_error.kind() {
                    TimedOut => return Failure::Timeout,
                    UnexpectedEof | ConnectionReset | ConnectionAborted | BrokenPipe => {
                        return Failure::Cut
                    }
                    _ => {}
                }
            }
            if let Some(inner) = cause.downcast_ref::<reqwest::Error>() {
                if inner.is_timeout() {
                    return Failure::Timeout;
                }
                if inner.is_body() {
                    return Failure::Cut;
                }
            }
            source = cause.source();
        }
        Failure::Other
    }
}

/// The rule: whether another attempt may succeed where this one failed.
pub fn is_transient(failure: Failure) -> bool {
    match failure {
        Failure::Status(status) => is_transient_status(status),
        Failure::Connect { answered_before } => answered_before,
        Failure::Timeout | Failure::Cut => true,
        Failure::Other => false,
    }
}

/// 408, 429, 500, 502, 503, 504: the statuses that say "not now" rather than "no".
pub fn is_transient_status(status: StatusCode) -> bool {
    matches!(
        status,
        StatusCode::REQUEST_TIMEOUT
            | StatusCode::TOO_MANY_REQUESTS
            | StatusCode::INTERNAL_SERVER_ERROR
            | StatusCode::BAD_GATEWAY
            | StatusCode::SERVICE_UNAVAILABLE
            | StatusCode::GATEWAY_TIMEOUT
    )
}

/// A `Retry-After` given in seconds (the HTTP-date form is not used by the servers
/// cudastack talks to, and is ignored: the backoff applies).
pub fn retry_after(headers: &HeaderMap) -> Option<Duration> {
    let seconds: u64 = headers
        .get(RETRY_AFTER)?
        .to_str()
        .ok()?
        .trim()
        .parse()
        .ok()?;
    Some(Duration::from_secs(seconds))
}

/// The attempts at one thing: counts them, waits between them and says each retry.
#[derive(Debug)]
pub struct Attempts {
    policy: RetryPolicy,
    what: String,
    made: u32,
}

impl Attempts {
    /// Count the start of an attempt; returns its number (1-based).
    pub fn start(&mut self) -> u32 {
        self.made += 1;
        self.made
    }

    /// Attempts made so far (for errors that say "after N attempts").
    pub fn made(&self) -> u32 {
        self.made
    }

    /// The last attempt moved things forward: count again from one.
    pub fn progressed(&mut self) {
        self.made = self.made.min(1);
    }

    /// After a transient failure: if attempts are left, say why on stderr, wait (the
    /// server's `after`, else the backoff; capped) and return true. False when the
    /// attempts are spent: the caller fails with what it has.
    pub async fn retry(&mut self, why: impl fmt::Display, after: Option<Duration>) -> bool {
        if self.made >= self.policy.max_attempts {
            return false;
        }
        let wait = after
            .unwrap_or_else(|| self.policy.backoff(self.made))
            .min(self.policy.max_backoff);
        tracing::warn!(
            "retrying {} in {wait:?} (attempt {} of {}): {why}",
            self.what,
            self.made + 1,
            self.policy.max_attempts
        );
        tokio::time::sleep(wait).await;
        true
    }
}

/// A URL as it may be shown: a user name and password in it (a mirror URL given on the
/// command line may carry them) are masked as `****`.
pub struct Redacted<'a>(&'a Url);

pub fn redacted(url: &Url) -> Redacted<'_> {
    Redacted(url)
}

impl fmt::Display for Redacted<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let url = self.0;
        if url.username().is_empty() && url.password().is_none() {
            return f.write_str(url.as_str());
        }
        let mut shown = url.clone();
        if !url.username().is_empty() {
            let _ = shown.set_username("****");
        }
        if url.password().is_some() {
            let _ = shown.set_password(Some("****"));
        }
        f.write_str(shown.as_str())
    }
}

/// An error and its causes on one line, for retry messages.
pub fn error_chain(error: &dyn std::error::Error) -> String {
    let mut text = error.to_string();
    let mut source = error.source();
    while let Some(cause) = source {
        let cause_text = cause.to_string();
        if !text.contains(&cause_text) {
            text.push_str(": ");
            text.push_str(&cause_text);
        }
        source = cause.source();
    }
    text
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_rule_as_a_table() {
        let status = |code: u16| Failure::Status(StatusCode::from_u16(code).unwrap());
        let table = [
            (status(408), true),
            (status(429), true),
            (status(500), true),
            (status(502), true),
            (status(503), true),
            (status(504), true),
            (status(400), false),
            (status(401), false),
            (status(403), false),
            (status(404), false),
            (status(410), false),
            (status(416), false),
            (status(501), false),
            (status(505), false),
            (
                Failure::Connect {
                    answered_before: false,
                },
                false,
            ),
            (
                Failure::Connect {
                    answered_before: true,
                },
                true,
            ),
            (Failure::Timeout, true),
            (Failure::Cut, true),
            (Failure::Other, false),
        ];
        for (failure, transient) in table {
            assert_eq!(is_transient(failure), transient, "{failure:?}");
        }
    }

    #[test]
    fn backoff_doubles_and_caps() {
        let policy = RetryPolicy {
            max_attempts: 10,
            initial_backoff: Duration::from_millis(100),
            max_backoff: Duration::from_millis(700),
        };
        assert_eq!(policy.backoff(1), Duration::from_millis(100));
        assert_eq!(policy.backoff(2), Duration::from_millis(200));
        assert_eq!(policy.backoff(3), Duration::from_millis(400));
        assert_eq!(policy.backoff(4), Duration::from_millis(700));
        assert_eq!(policy.backoff(40), Duration::from_millis(700));
    }

    #[test]
    fn retry_after_in_seconds_only() {
        let mut headers = HeaderMap::new();
        assert_eq!(retry_after(&headers), None);
        headers.insert(RETRY_AFTER, "3".parse().unwrap());
        assert_eq!(retry_after(&headers), Some(Duration::from_secs(3)));
        headers.insert(
            RETRY_AFTER,
            "Wed, 21 Oct 2015 07:28:00 GMT".parse().unwrap(),
        );
        assert_eq!(retry_after(&headers), None);
    }

    #[tokio::test]
    async fn attempts_stop_at_the_limit_and_restart_on_progress() {
        let policy = RetryPolicy {
            max_attempts: 2,
            initial_backoff: Duration::from_millis(1),
            max_backoff: Duration::from_millis(1),
        };
        let mut attempts = policy.attempts("GET `x`");
        assert_eq!(attempts.start(), 1);
        assert!(attempts.retry("503", None).await);
        assert_eq!(attempts.start(), 2);
        assert!(!attempts.retry("503", None).await);
        attempts.progressed();
        assert!(attempts.retry("cut", None).await);
        assert_eq!(attempts.start(), 2);
        assert!(!attempts.retry("cut", None).await);
    }
}
