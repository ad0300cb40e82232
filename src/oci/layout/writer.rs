//! Writing an OCI layout: [`LayoutWriter`], the one writer of its files (see the docs of
//! [`super`] for the guarantees: the directory's lock held for the whole write, blobs first
//! and `index.json` last, everything it created removed again unless committed).

use std::io::{self, Write};
use std::path::{Path, PathBuf};

use oci_spec::image::{Descriptor, ImageManifest, MediaType};

use super::index::{ref_name_of, LayoutIndex, INDEX_FILE};
use super::reader::read_json_blob;
use super::{blob_path, LAYOUT_FILE};
use crate::canonical::to_canonical_json;
use crate::digest::{Digest, HashingWriter};
use crate::oci::{check_tag, digest_of, io_error, DockerManifestEntry, OciError};

fn same_file(a: &Path, b: &Path) -> bool {
    use std::os::unix::fs::MetadataExt;
    match (std::fs::metadata(a), std::fs::metadata(b)) {
        (Ok(a), Ok(b)) => a.dev() == b.dev() && a.ino() == b.ino(),
        _ => false,
    }
}

/// The digest of the file at `path`, streamed.
fn hash_file(path: &Path) -> io::Result<Digest> {
    let mut file = std::fs::File::open(path)?;
    let mut hashing = HashingWriter::new(io::sink());
    io::copy(&mut file, &mut hashing)?;
    Ok(hashing.finish().1)
}

const TEMP_PREFIX: &str = ".tmp-";

/// One exclusive, all-or-nothing write into an OCI layout directory (see the module
/// docs): the directory's lock, blobs placed first, `index.json` last, and on drop without
/// [`LayoutWriter::commit`] every file and directory it created removed again.
#[derive(Debug)]
pub struct LayoutWriter {
    dir: PathBuf,
    /// The open layout directory, whose `flock(2)` is held while the writer lives.
    _lock: std::fs::File,
    /// Files this writer created (not ones it replaced), removed unless committed.
    created: Vec<PathBuf>,
    /// Directories this writer created, outermost first, removed (if empty) unless committed.
    created_dirs: Vec<PathBuf>,
    committed: bool,
}

impl LayoutWriter {
    /// Open (creating if needed) the layout at `dir` and take its lock, waiting for any
    /// other writer of it.
    pub fn open(dir: &Path) -> Result<Self, OciError> {
        let blobs = dir.join("blobs").join("sha256");
        let (lock, created_dirs) = lock_directory(dir, &blobs)?;
        let mut writer = Self {
            dir: dir.to_path_buf(),
            _lock: lock,
            created: Vec::new(),
            created_dirs,
            committed: false,
        };
        // Temp files of a writer that was killed: nobody else writes while we hold the lock.
        for folder in [dir.to_path_buf(), blobs] {
            remove_temp_files(&folder);
        }
        let layout_file = dir.join("oci-layout");
        if fs_err::read(&layout_file).ok().as_deref() != Some(LAYOUT_FILE.as_bytes()) {
            writer.put_top_level("oci-layout", LAYOUT_FILE.as_bytes())?;
        }
        Ok(writer)
    }

    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// Keep everything written.
    pub fn commit(mut self) {
        self.committed = true;
    }

    /// Whether the layout already holds the blob `digest` as the file `source` or as a
    /// file that hashes to `digest`. A blob with other bytes is reported and will be
    /// replaced.
    fn holds(&self, target: &Path, digest: &Digest, source: Option<&Path>) -> bool {
        if !target.is_file() {
            return false;
        }
        if source.is_some_and(|source| same_file(source, target)) {
            return true;
        }
        match hash_file(target) {
            Ok(found) if found == *digest => true,
            Ok(found) => {
                tracing::warn!(
                    path = %target.display(),
                    expected = %digest,
                    found = %found,
                    "a blob of the OCI layout does not match its digest; replacing it"
                );
                false
            }
            Err(_) => false,
        }
    }

    /// Put the blob at `source`, whose bytes are `digest`, into the layout: a hard link
    /// when the filesystem allows, else a copy hashed on the way (a mismatch is an error
    /// and nothing is kept).
    pub fn put_file(&mut self, source: &Path, digest: &Digest) -> Result<(), OciError> {
        let blobs = self.dir.join("blobs").join("sha256");
        let target = blobs.join(digest.hex());
        if self.holds(&target, digest, Some(source)) {
            return Ok(());
        }
        let existed = target.exists();
        let linked = tempfile::Builder::new()
            .prefix(TEMP_PREFIX)
            .make_in(&blobs, |path| std::fs::hard_link(source, path));
        match linked {
            Ok(temp) => {
                temp.persist(&target)
                    .map_err(|e| io_error(&target)(e.error))?;
            }
            Err(_) => {
                // Different filesystem (or no hardlink support): copy, verifying.
                let mut reader = fs_err::File::open(source).map_err(io_error(source))?;
                let temp =
                    crate::atomic_file::temp_in(&blobs, TEMP_PREFIX).map_err(io_error(&blobs))?;
                let temp_path = temp.path().to_path_buf();
                let mut writer = HashingWriter::new(io::BufWriter::with_capacity(1 << 20, temp));
                io::copy(&mut reader, &mut writer).map_err(io_error(&temp_path))?;
                let (buffered, found, _) = writer.finish();
                let temp = buffered
                    .into_inner()
                    .map_err(|e| io_error(&temp_path)(e.into_error()))?;
                if found != *digest {
                    return Err(OciError::BlobMismatch {
                        path: source.to_path_buf(),
                        expected: *digest,
                        found,
                    });
                }
                crate::atomic_file::persist(temp, &target).map_err(io_error(&target))?;
            }
        }
        if !existed {
            self.created.push(target);
        }
        Ok(())
    }

    /// Put a small document (config, manifest, index) into the layout; returns its digest.
    pub fn put_bytes(&mut self, bytes: &[u8]) -> Result<Digest, OciError> {
        let digest = Digest::of_bytes(bytes);
        let path = blob_path(&self.dir, &digest);
        if !self.holds(&path, &digest, None) {
            self.write_file(&path, bytes)?;
        }
        Ok(digest)
    }

    /// Replace a file at the top of the layout (`index.json`, `manifest.json`,
    /// `oci-layout`) atomically.
    pub fn put_top_level(&mut self, name: &str, bytes: &[u8]) -> Result<(), OciError> {
        let path = self.dir.join(name);
        self.write_file(&path, bytes)
    }

    /// Name `descriptor` `ref_name` in `index.json` (moving the name if another entry had
    /// it), with the docker-save `manifest.json` beside it kept in step: the last files a
    /// write puts.
    pub fn name(&mut self, descriptor: Descriptor, ref_name: &str) -> Result<(), OciError> {
        let index = LayoutIndex::read_or_empty(&self.dir)?.with_name(descriptor, ref_name);
        self.put_docker_manifest(index.entries())?;
        self.put_index(&index)
    }

    /// [`Self::name`] without touching `manifest.json`: what a pull does (the layout's
    /// `manifest.json`, if it has one, is kept as it was).
    pub fn name_in_index_only(
        &mut self,
        descriptor: Descriptor,
        ref_name: &str,
    ) -> Result<(), OciError> {
        let index = LayoutIndex::read_or_empty(&self.dir)?.with_name(descriptor, ref_name);
        self.put_index(&index)
    }

    /// Drop the entries named `names` from `index.json` (their blobs stay: another entry
    /// may share them).
    pub fn unname(&mut self, names: &[String]) -> Result<(), OciError> {
        let index = LayoutIndex::read_or_empty(&self.dir)?.without_names(names);
        self.put_index(&index)
    }

    fn put_index(&mut self, index: &LayoutIndex) -> Result<(), OciError> {
        let bytes = index.to_bytes()?;
        self.put_top_level(INDEX_FILE, &bytes)
    }

    /// Keep a docker-save `manifest.json` beside `index.json` (as Docker 25+ `save` does),
    /// so a plain tar of the layout is also accepted by `docker load` on daemons that
    /// need it (Docker < 25, and the classic image store of later versions). A ref name
    /// that is a valid Docker reference becomes the tag (`name` means `name:latest`).
    fn put_docker_manifest(&mut self, manifests: &[Descriptor]) -> Result<(), OciError> {
        let mut entries = Vec::new();
        for descriptor in manifests {
            if descriptor.media_type() != &MediaType::ImageManifest
                || descriptor.artifact_type().is_some()
            {
                continue;
            }
            entries.push(self.docker_manifest_entry(descriptor)?);
        }
        let bytes = to_canonical_json(&entries).expect("manifest.json serialises");
        self.put_top_level("manifest.json", &bytes)
    }

    /// The docker-save entry of the image manifest `descriptor` names.
    fn docker_manifest_entry(
        &self,
        descriptor: &Descriptor,
    ) -> Result<DockerManifestEntry, OciError> {
        let dir = self.dir.as_path();
        let manifest: ImageManifest = read_json_blob(dir, descriptor, "an OCI image manifest")?;
        let name = |d: &Descriptor| -> Result<String, OciError> {
            let digest = digest_of(d).map_err(|problem| OciError::InvalidLayout {
                dir: dir.to_path_buf(),
                problem,
            })?;
            Ok(format!("blobs/sha256/{}", digest.hex()))
        };
        let repo_tags = ref_name_of(descriptor)
            .map(|name| {
                if name.contains(':') {
                    name.to_string()
                } else {
                    format!("{name}:latest")
                }
            })
            .filter(|tag| check_tag(tag).is_ok())
            .into_iter()
            .collect();
        Ok(DockerManifestEntry {
            config: name(manifest.config())?,
            repo_tags,
            layers: manifest
                .layers()
                .iter()
                .map(name)
                .collect::<Result<_, _>>()?,
        })
    }

    fn write_file(&mut self, path: &Path, bytes: &[u8]) -> Result<(), OciError> {
        let existed = path.exists();
        let folder = path.parent().unwrap_or(&self.dir);
        let mut temp =
            crate::atomic_file::temp_in(folder, TEMP_PREFIX).map_err(io_error(folder))?;
        temp.write_all(bytes).map_err(io_error(temp.path()))?;
        crate::atomic_file::persist(temp, path).map_err(io_error(path))?;
        if !existed {
            self.created.push(path.to_path_buf());
        }
        Ok(())
    }
}

/// Create the layout directory and its `blobs/sha256` as needed and lock it: the open
/// directory (holding the lock) and the directories created, outermost first.
fn lock_directory(dir: &Path, blobs: &Path) -> Result<(std::fs::File, Vec<PathBuf>), OciError> {
    use std::os::unix::fs::MetadataExt;
    loop {
        let created_dirs: Vec<PathBuf> = [dir.to_path_buf(), dir.join("blobs"), blobs.into()]
            .into_iter()
            .filter(|d| !d.exists())
            .collect();
        fs_err::create_dir_all(blobs).map_err(io_error(blobs))?;
        let handle = std::fs::File::open(dir).map_err(io_error(dir))?;
        handle.lock().map_err(io_error(dir))?;
        // A writer that failed while we waited may have removed the directory it had
        // created: lock the directory that is there now.
        let current = std::fs::metadata(dir).ok();
        let locked = handle.metadata().map_err(io_error(dir))?;
        if current.is_some_and(|c| c.ino() == locked.ino() && c.dev() == locked.dev())
            && blobs.is_dir()
        {
            return Ok((handle, created_dirs));
        }
    }
}

/// Remove the temp files (`.tmp-*`) a killed writer left in `folder`.
fn remove_temp_files(folder: &Path) {
    if let Ok(entries) = std::fs::read_dir(folder) {
        for entry in entries.flatten() {
            if entry.file_name().to_string_lossy().starts_with(TEMP_PREFIX) {
                let _ = std::fs::remove_file(entry.path());
            }
        }
    }
}

impl Drop for LayoutWriter {
    fn drop(&mut self) {
        if self.committed {
            return;
        }
        for path in self.created.iter().rev() {
            let _ = std::fs::remove_file(path);
        }
        for dir in self.created_dirs.iter().rev() {
            let _ = std::fs::remove_dir(dir);
        }
    }
}
