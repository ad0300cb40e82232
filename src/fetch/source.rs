//! Where Python distributions can come from: a simple index (PyPI, PyTorch's per-CUDA
//! indexes, any PEP 503/691 server) or a local mirror directory. The resolver asks the
//! sources in priority order and takes each package from the first one that has it.
//!
//! A package pinned to one of the recipe's named indexes is never asked of another source
//! ([`PackageSource::Excluding`]): were it asked of PyPI, anyone could publish a package of
//! that name there and have it locked (dependency confusion).

use std::collections::BTreeSet;
use std::fmt;
use std::sync::Arc;

use crate::fetch::http::{HttpClient, HttpError};
use crate::fetch::index::{DistFile, IndexError, ProjectPage, SimpleIndex};
use crate::fetch::local_wheels::LocalWheels;
use crate::fetch::metadata::{local_wheel_metadata, wheel_metadata, MetadataError};
use crate::fetch::mirror::{MirrorDir, MirrorError};
use crate::names::PackageName;

#[derive(Debug, thiserror::Error)]
pub enum SourceError {
    #[error(transparent)]
    Index(#[from] IndexError),
    #[error(transparent)]
    Mirror(#[from] MirrorError),
    #[error("The blocking task reading a mirror failed")]
    Join(#[from] tokio::task::JoinError),
    #[error("`{page}` gives no upload time for any of its {files} files, so none can be shown to predate {as_of} (`--as-of`)\n  hint: lock without `--as-of`, or take `{project}` from an index that publishes upload times (PEP 700; PyPI does)")]
    NoUploadTimes {
        project: PackageName,
        page: String,
        files: usize,
        as_of: jiff::Timestamp,
    },
}

/// One package source.
#[derive(Debug, Clone)]
pub enum PackageSource {
    /// A simple index. `plain_linux` accepts `linux_<arch>` wheels, which PyTorch's own
    /// indexes publish and PyPI forbids.
    Index {
        index: SimpleIndex,
        plain_linux: bool,
    },
    Mirror(MirrorDir),
    /// The recipe's `wheels:` directories, read when the recipe was resolved.
    Local(LocalWheels),
    /// `source`, never asked for the packages in `excluded` (pinned to another index).
    Excluding {
        source: Box<PackageSource>,
        excluded: Arc<BTreeSet<PackageName>>,
    },
    /// `source` as it was at `cutoff`: files uploaded
    /// later are not offered, nor files whose upload time the index does not give (they
    /// cannot be shown to be older). A `--mirror` directory is the site's own fixed set
    /// and is offered whole.
    AsOf {
        source: Box<PackageSource>,
        cutoff: jiff::Timestamp,
    },
}

impl fmt::Display for PackageSource {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            PackageSource::Index { index, .. } => write!(f, "{}", index.base()),
            PackageSource::Mirror(mirror) => write!(f, "{}", mirror.url()),
            PackageSource::Local(local) => f.write_str(&local.label()),
            PackageSource::Excluding { source, .. } | PackageSource::AsOf { source, .. } => {
                source.fmt(f)
            }
        }
    }
}

impl PackageSource {
    /// PyPI (`linux_*` wheels refused).
    pub fn pypi(client: HttpClient) -> Self {
        PackageSource::Index {
            index: SimpleIndex::pypi(client),
            plain_linux: false,
        }
    }

    pub fn accepts_plain_linux(&self) -> bool {
        match self {
            PackageSource::Index { plain_linux, .. } => *plain_linux,
            // A mirror holds whatever the site put there, often copied from PyTorch's index.
            PackageSource::Mirror(_) => true,
            // The team's own builds (`linux_x86_64` is what `pip wheel` names a local
            // compile), for the images of this recipe.
            PackageSource::Local(_) => true,
            PackageSource::Excluding { source, .. } | PackageSource::AsOf { source, .. } => {
                source.accepts_plain_linux()
            }
        }
    }

    /// This source as it was at `cutoff`; a mirror directory or `wheels:` is itself at
    /// any time.
    pub fn as_of(self, cutoff: jiff::Timestamp) -> Self {
        match self {
            PackageSource::Mirror(_) | PackageSource::Local(_) => self,
            PackageSource::Excluding { source, excluded } => PackageSource::Excluding {
                source: Box::new(source.as_of(cutoff)),
                excluded,
            },
            PackageSource::AsOf { source, .. } => source.as_of(cutoff),
            PackageSource::Index { .. } => PackageSource::AsOf {
                source: Box::new(self),
                cutoff,
            },
        }
    }

    /// This source, never asked for `excluded`; itself when `excluded` is empty.
    pub fn excluding(self, excluded: &Arc<BTreeSet<PackageName>>) -> Self {
        if excluded.is_empty() {
            return self;
        }
        PackageSource::Excluding {
            source: Box::new(self),
            excluded: excluded.clone(),
        }
    }

    /// Whether this source is ever asked for `name` (not when it is pinned elsewhere).
    pub fn asks_for(&self, name: &PackageName) -> bool {
        match self {
            PackageSource::Excluding { excluded, .. } => !excluded.contains(name),
            _ => true,
        }
    }

    /// The files of a project, or `None` when this source does not have it.
    pub async fn project(&self, name: &PackageName) -> Result<Option<ProjectPage>, SourceError> {
        match self {
            PackageSource::Excluding { source, excluded } => {
                if excluded.contains(name) {
                    return Ok(None);
                }
                Box::pin(source.project(name)).await
            }
            PackageSource::AsOf { source, cutoff } => {
                let Some(page) = Box::pin(source.project(name)).await? else {
                    return Ok(None);
                };
                uploaded_by(page, *cutoff).map(Some)
            }
            PackageSource::Index { index, .. } => match index.project(name).await {
                Ok(page) => Ok(Some(page)),
                Err(IndexError::Http(HttpError::NotFound { .. })) => Ok(None),
                Err(error) => Err(error.into()),
            },
            PackageSource::Mirror(mirror) => {
                let mirror = mirror.clone();
                let name = name.clone();
                Ok(tokio::task::spawn_blocking(move || mirror.project(&name)).await??)
            }
            PackageSource::Local(local) => Ok(local.project(name)),
        }
    }

    /// The METADATA text of one of this source's files.
    pub async fn metadata(&self, file: &DistFile) -> Result<String, MetadataError> {
        match self {
            PackageSource::Excluding { source, .. } | PackageSource::AsOf { source, .. } => {
                Box::pin(source.metadata(file)).await
            }
            PackageSource::Index { index, .. } => wheel_metadata(index.client(), file).await,
            // Read (bounded) and held to the file name when the directory was read.
            PackageSource::Local(local) => local
                .by_url(&file.url)
                .map(|wheel| wheel.metadata.clone())
                .ok_or_else(|| MetadataError::Invalid {
                    location: file.url.to_string(),
                    reason: "not a wheel of the recipe's `wheels:`".into(),
                }),
            PackageSource::Mirror(_) => {
                let path = file
                    .url
                    .to_file_path()
                    .map_err(|()| MetadataError::Invalid {
                        location: file.url.to_string(),
                        reason: "not a local file URL".into(),
                    })?;
                tokio::task::spawn_blocking(move || local_wheel_metadata(&path))
                    .await
                    .map_err(|error| MetadataError::Invalid {
                        location: file.url.to_string(),
                        reason: error.to_string(),
                    })?
            }
        }
    }
}

/// `page` less the files uploaded after `cutoff` or without an upload time; an error when
/// none of its files has one (the index cannot answer "as of", and saying "no version"
/// would send the user looking in the wrong place).
fn uploaded_by(mut page: ProjectPage, cutoff: jiff::Timestamp) -> Result<ProjectPage, SourceError> {
    let listed = page.files.len();
    if listed > 0 && page.files.iter().all(|f| f.uploaded_at().is_none()) {
        return Err(SourceError::NoUploadTimes {
            project: page.name,
            page: page.url.to_string(),
            files: listed,
            as_of: cutoff,
        });
    }
    page.files
        .retain(|file| file.uploaded_at().is_some_and(|at| at <= cutoff));
    Ok(page)
}
