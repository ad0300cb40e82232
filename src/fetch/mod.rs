//! Fetch: get every artifact a lock names, by hash, from where it lives.
//!
//! Sits between `lock` (which decides *what*: URL + sha256 + size) and the layer
//! assemblers (which read blobs from the cache). The pieces:
//! - [`http`]: the shared client (user agent, retries with backoff, a bound on transfers);
//! - [`credentials`]: basic-auth credentials of the recipe's private indexes, from the
//!   environment, netrc or a keyring helper, sent only to each index's origin;
//! - [`index`]: PEP 691 JSON and PEP 503 HTML simple indexes (PyPI, PyTorch's indexes),
//!   with [`html`] as its anchor reader;
//! - [`file_name`]: every outside name that becomes a path, checked to be one component;
//! - [`remote_zip`] and [`metadata`]: a wheel's METADATA without downloading the wheel
//!   (PEP 658 file, else HTTP range reads), and big zip entries streamed;
//! - [`redist`]: NVIDIA `redistrib_<version>.json` manifests (CUDA components, cuDNN);
//! - [`mirror`]: a local directory of wheels for air-gapped sites;
//! - [`local_wheels`]: the recipe's `wheels:` directories, read without leaving them;
//! - [`git`]: a git requirement's commit and its tree; [`source_tree`]: a tree (a commit's,
//!   a local project's) as a canonical source archive;
//! - [`source`]: the package sources the resolver asks, in priority order;
//! - [`download`] and [`progress`]: streaming, resumable, hash-checked downloads into the
//!   [`crate::cache::BlobStore`], with progress on a reporter trait and an offline mode.
//!
//! Nothing here decides which version to use; that is [`crate::lock`].
// Errors here carry the URL they are about (a `Url` is ~90 bytes) so every message can name
// it; they are built on cold paths only, so boxing them would buy nothing measurable.
#![allow(clippy::result_large_err)]

pub mod credentials;
pub mod download;
pub mod file_name;
pub mod git;
pub mod html;
pub mod http;
pub mod index;
pub mod local_wheels;
pub mod metadata;
pub mod mirror;
pub mod progress;
pub mod redist;
pub mod remote_zip;
pub mod source;
pub mod source_tree;
