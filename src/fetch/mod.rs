//! Fetch: get every artifact a lock names, by hash, from where it lives.
//!
//! Sits between `lock` (which decides *what*: URL + sha256 + size) and the layer
//! assemblers (which read blobs from the cache). The pieces:
//! - [`http`]: the shared client (user agent, retries with backoff, a bound on transfers);
//! - [`index`]: PEP 691 JSON and PEP 503 HTML simple indexes (PyPI, PyTorch's indexes);
//! - [`wheel_filename`]: wheel names parsed into name, version, build and tags;
//! - [`remote_zip`] and [`metadata`]: a wheel's METADATA without downloading the wheel.
//!
//! Nothing here decides which version to use; that is [`crate::lock`].
pub mod download;
pub mod html;
pub mod http;
pub mod index;
pub mod metadata;
pub mod mirror;
pub mod progress;
pub mod redist;
pub mod remote_zip;
pub mod source;
pub mod wheel_filename;
