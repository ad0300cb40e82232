//! [`ResumableBody`]: a response body that, cut mid-stream, is asked for again from the
//! byte it stopped at (`Range: bytes=N-`), after checking the server sent that byte.

use std::future::Future;

use bytes::Bytes;
use reqwest::header::{HeaderMap, HeaderValue, ACCEPT_ENCODING, CONTENT_RANGE, RANGE};
use reqwest::{Response, StatusCode, Url};

use super::retry::{error_chain, is_transient, redacted, Attempts, Failure, RetryPolicy};

/// A parsed `Content-Range: bytes start-end/total` header.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ContentRange {
    pub start: u64,
    pub end: u64,
    /// `None` when the server answered `*` for the total.
    pub total: Option<u64>,
}

impl ContentRange {
    pub fn parse(value: &str) -> Option<ContentRange> {
        let rest = value.trim().strip_prefix("bytes ")?;
        let (span, total) = rest.split_once('/')?;
        let (start, end) = span.split_once('-')?;
        let total = match total.trim() {
            "*" => None,
            t => Some(t.parse().ok()?),
        };
        Some(ContentRange {
            start: start.trim().parse().ok()?,
            end: end.trim().parse().ok()?,
            total,
        })
    }
}

/// The headers of a request for a body from byte `from` on: the identity encoding (a
/// compressed body would make offsets meaningless) and, past 0, `Range: bytes=from-`.
pub fn range_headers(from: u64) -> HeaderMap {
    let mut headers = HeaderMap::new();
    headers.insert(ACCEPT_ENCODING, HeaderValue::from_static("identity"));
    if from > 0 {
        headers.insert(
            RANGE,
            HeaderValue::from_str(&format!("bytes={from}-")).expect("a range is ASCII"),
        );
    }
    headers
}

/// A read that failed for good.
#[derive(Debug, thiserror::Error)]
pub enum ReadError {
    #[error(
        "The transfer of `{}` kept failing after {attempts} attempts ({offset} bytes read)",
        redacted(url)
    )]
    Cut {
        url: Url,
        attempts: u32,
        offset: u64,
        #[source]
        source: reqwest::Error,
    },
    #[error(
        "`{}` answered a request for bytes {asked}- with {status} `{answered}`",
        redacted(url)
    )]
    WrongRange {
        url: Url,
        asked: u64,
        status: StatusCode,
        answered: String,
    },
}

/// What a read yields next.
#[derive(Debug)]
pub enum Piece {
    /// The next bytes, right after the last ones.
    Bytes(Bytes),
    /// The server ignored the range and sends the whole body again: drop what was read,
    /// the bytes that follow start at 0.
    Restart,
}

/// A body read from `from` on, continued after a transient cut. `open(offset)` sends the
/// request for the body from `offset` (with [`range_headers`], auth and request-level
/// retries: that is the caller's layer) and returns a success response, or `None` when
/// the server says nothing lies past `offset` (416 on a resumed read).
pub struct ResumableBody<Open> {
    url: Url,
    open: Open,
    attempts: Attempts,
    offset: u64,
    /// The furthest offset any answer reached: after a restart, the bytes up to it are read
    /// again and are not progress.
    furthest: u64,
    response: Option<Response>,
    done: bool,
}

impl<Open, Fut, E> ResumableBody<Open>
where
    Open: FnMut(u64) -> Fut,
    Fut: Future<Output = Result<Option<Response>, E>>,
    E: From<ReadError>,
{
    /// A read of `url` from byte `from`; nothing is sent before the first [`Self::next`].
    pub fn new(url: &Url, from: u64, policy: &RetryPolicy, open: Open) -> Self {
        ResumableBody {
            attempts: policy.attempts(format_args!("GET `{}`", redacted(url))),
            url: url.clone(),
            open,
            offset: from,
            furthest: from,
            response: None,
            done: false,
        }
    }

    /// The next piece, or `None` at the end of the body.
    pub async fn next(&mut self) -> Result<Option<Piece>, E> {
        loop {
            if self.done {
                return Ok(None);
            }
            let Some(response) = self.response.as_mut() else {
                self.attempts.start();
                match (self.open)(self.offset).await? {
                    None => self.done = true,
                    Some(response) => {
                        let restart = self.check_range(&response)?;
                        self.response = Some(response);
                        if restart {
                            return Ok(Some(Piece::Restart));
                        }
                    }
                }
                continue;
            };
            match response.chunk().await {
                Ok(Some(bytes)) => {
                    self.offset += bytes.len() as u64;
                    // Only bytes past the furthest read count the attempts from one again:
                    // a server that ignores the range and cuts at the same byte each time
                    // would otherwise be asked again for ever.
                    if self.offset > self.furthest {
                        self.furthest = self.offset;
                        self.attempts.progressed();
                    }
                    return Ok(Some(Piece::Bytes(bytes)));
                }
                Ok(None) => {
                    self.response = None;
                    self.done = true;
                }
                Err(source) => {
                    self.response = None;
                    let source = source.without_url();
                    let why = format!("cut after {} bytes: {}", self.offset, error_chain(&source));
                    if !(is_transient(Failure::of_error(&source, true))
                        && self.attempts.retry(why, None).await)
                    {
                        return Err(ReadError::Cut {
                            url: self.url.clone(),
                            attempts: self.attempts.made(),
                            offset: self.offset,
                            source,
                        }
                        .into());
                    }
                }
            }
        }
    }

    /// Whether the answer to a request from `offset` starts there (false), or is the whole
    /// body (true: restart at 0). Any other start is an error.
    fn check_range(&mut self, response: &Response) -> Result<bool, ReadError> {
        if self.offset == 0 {
            return Ok(false);
        }
        let content_range = response
            .headers()
            .get(CONTENT_RANGE)
            .map(|value| value.to_str().unwrap_or_default().to_string());
        let start = content_range
            .as_deref()
            .and_then(ContentRange::parse)
            .map(|range| range.start);
        match (response.status(), start) {
            (StatusCode::PARTIAL_CONTENT, Some(start)) if start == self.offset => Ok(false),
            (StatusCode::OK, _) => {
                tracing::info!(url = %redacted(&self.url), "server ignored Range; restarting from zero");
                self.offset = 0;
                Ok(true)
            }
            (status, _) => Err(ReadError::WrongRange {
                url: self.url.clone(),
                asked: self.offset,
                status,
                answered: content_range.unwrap_or_default(),
            }),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn content_range_parses() {
        assert_eq!(
            ContentRange::parse("bytes 10-19/100"),
            Some(ContentRange {
                start: 10,
                end: 19,
                total: Some(100)
            })
        );
        assert_eq!(ContentRange::parse("bytes 0-0/*").unwrap().total, None);
        assert_eq!(ContentRange::parse("items 0-1/2"), None);
        assert_eq!(ContentRange::parse("bytes 5/10"), None);
    }

    #[test]
    fn range_headers_ask_from_a_byte_past_zero() {
        assert!(range_headers(0).get(RANGE).is_none());
        assert_eq!(range_headers(1000)[RANGE], "bytes=1000-");
        assert_eq!(range_headers(5)[ACCEPT_ENCODING], "identity");
    }
}
