//! A Debian-format APT archive that a test controls (issue 18), served on 127.0.0.1.
//!
//! The lock resolves a base's packages with apt itself and the build installs only the
//! locked .debs; to show what happens when the mirror moves on, loses a file, or is an
//! archive this machine cannot reach (Ubuntu's ports archive, snapshot.debian.org), the
//! tests publish their own archive in the formats of deb.debian.org:
//!
//! - [`archive`]: a signed archive in a directory (`dists/DIST/InRelease`, `Release`,
//!   `Release.gpg`, `COMPONENT/binary-ARCH/Packages{,.gz,.xz}`, `pool/...`) built from real
//!   .deb files, with a throwaway gpg key whose public half is a `signed-by=` keyring.
//! - [`server`]: serves a directory over HTTP on 127.0.0.1 as it is at request time.
//! - [`apt`]: apt-get as the current user against a throwaway root (the way the lock runs
//!   it), to check the fixture and to resolve package sets.
//! - [`debs`]: real .debs from deb.debian.org, downloaded once into the target directory.
//!
//! Nothing here is product code: errors carry the command and its output so a failing test
//! says what went wrong, and the gates ([`skip_reason`], [`debs::fetch_or_skip`]) decide
//! whether a test can run here through `crate::gate`.
#![allow(dead_code)]

pub(crate) use crate::gate;

pub mod apt;
pub mod archive;
pub mod debs;

pub mod server;

pub use apt::AptRoot;
// Re-exported for the tests that lock against a fixture (not all use every type yet).
#[allow(unused_imports)]
pub use archive::{repack_with_version, Archive, DebInfo, PublishedDeb, SigningKey, Suite};
pub use server::DirServer;

use std::path::PathBuf;
use std::process::{Command, Output};

/// What went wrong while building, serving or querying a fixture archive.
#[derive(Debug, thiserror::Error)]
pub enum FixtureError {
    #[error(transparent)]
    Io(#[from] std::io::Error),
    #[error("`{command}` failed ({status})\n--- stdout\n{stdout}\n--- stderr\n{stderr}")]
    Command {
        command: String,
        status: String,
        stdout: String,
        stderr: String,
    },
    #[error(
        "Failed to run `{program}`: {source}\nhint: install it (apt-get install gpg apt dpkg)"
    )]
    Spawn {
        program: String,
        source: std::io::Error,
    },
    #[error("{0}")]
    Invalid(String),
}

pub type Result<T, E = FixtureError> = std::result::Result<T, E>;

/// Run `command`, returning its output when it exits 0 and an error with both output
/// streams otherwise.
pub(crate) fn run(command: &mut Command) -> Result<Output> {
    let output = output(command)?;
    if output.status.success() {
        return Ok(output);
    }
    Err(command_error(command, &output))
}

/// Run `command` and return its output whatever the exit status (for tests that expect
/// a failure and read its message).
pub(crate) fn output(command: &mut Command) -> Result<Output> {
    command.output().map_err(|source| FixtureError::Spawn {
        program: command.get_program().to_string_lossy().into_owned(),
        source,
    })
}

pub(crate) fn command_error(command: &Command, output: &Output) -> FixtureError {
    FixtureError::Command {
        command: describe(command),
        status: output.status.to_string(),
        stdout: String::from_utf8_lossy(&output.stdout).into_owned(),
        stderr: String::from_utf8_lossy(&output.stderr).into_owned(),
    }
}

fn describe(command: &Command) -> String {
    let mut words = vec![command.get_program().to_string_lossy().into_owned()];
    words.extend(command.get_args().map(|a| a.to_string_lossy().into_owned()));
    words.join(" ")
}

/// The programs a fixture archive needs: gpg signs, dpkg-deb reads control fields, apt-get
/// (with gpgv) checks the result.
const TOOLS: &[(&str, &str)] = &[
    ("gpg", "signs the archive's Release"),
    ("gpgv", "apt checks the signature with it"),
    ("dpkg-deb", "reads a .deb's control fields"),
    ("apt-get", "resolves and downloads packages"),
];

/// Why a fixture archive cannot be built here, or None. The caller reports it through the
/// gate (`skip.report()`, which fails under `CUDASTACK_REQUIRE=1`) and returns.
pub fn skip_reason() -> Option<gate::Skip> {
    for (program, why) in TOOLS {
        let works = Command::new(program)
            .arg("--version")
            .output()
            .is_ok_and(|o| o.status.success());
        if !works {
            return Some(gate::Skip::missing(
                program,
                format!("`{program}` is not available ({why}): apt-get install gpg gpgv apt dpkg"),
            ));
        }
    }
    None
}

/// A signed bookworm archive (its three suites) holding the real amd64 minbase set,
/// published and served on 127.0.0.1; None (the skip reported) when it cannot be made here.
pub fn minbase_archive() -> Option<(Archive, DirServer)> {
    if let Some(skip) = skip_reason() {
        skip.report();
        return None;
    }
    let minbase = debs::minbase_or_skip("amd64")?;
    let suites = ["bookworm", "bookworm-updates", "bookworm-security"]
        .map(|dist| Suite::debian(dist, &["amd64"]))
        .to_vec();
    let mut archive = Archive::new(suites).unwrap();
    archive.add_all("bookworm", "main", &minbase).unwrap();
    archive.publish().unwrap();
    let server = DirServer::serve(archive.root()).unwrap();
    Some((archive, server))
}

/// A fresh directory under the cargo target's temporary directory, removed on drop.
pub fn temp_dir(prefix: &str) -> Result<tempfile::TempDir> {
    let base = PathBuf::from(env!("CARGO_TARGET_TMPDIR"));
    fs_err::create_dir_all(&base)?;
    Ok(tempfile::Builder::new().prefix(prefix).tempdir_in(base)?)
}
