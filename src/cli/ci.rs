//! `cudastack ci emit`: write the GitHub Actions workflows that publish and re-lock the
//! recipe matrix (`.github/workflows/publish.yml`, `relock.yml`) and actionlint's runner
//! labels, generated from recipes/ by `cluster::workflows`. The jobs install a released
//! cudastack (this version unless `--cudastack-version` says another), so the files work in
//! any repository. `--check` writes nothing and exits 1 when a committed file differs from
//! what the recipes give.

use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Args, Subcommand};
use cudastack::cluster::workflows::{generate, WorkflowOptions, PUBLISH_PATH};
use serde::Serialize;

use super::{CommandResult, Printer};

#[derive(Debug, Args)]
pub struct CiArgs {
    #[command(subcommand)]
    command: CiCommand,
}

#[derive(Debug, Subcommand)]
enum CiCommand {
    /// Write the publish and relock workflows for every recipe in recipes/.
    #[command(after_help = super::examples::CI_EMIT)]
    Emit {
        /// Registry and namespace to push to (default: ghcr.io/<repository owner>, with the
        /// workflow's GITHUB_TOKEN). With --check, the registry the files were made with.
        #[arg(long)]
        registry: Option<String>,
        /// The cudastack release the jobs download and run [default: this cudastack's
        /// version]. With --check, the version the files were made with.
        #[arg(long, value_name = "VERSION")]
        cudastack_version: Option<String>,
        /// Where releases are downloaded from, for a mirror: the jobs fetch
        /// URL/vVERSION/SHA256SUMS and URL/vVERSION/cudastack-VERSION-TARGET.tar.gz
        /// [default: https://github.com/cudastack/cudastack/releases/download].
        #[arg(long, value_name = "URL")]
        release_url: Option<String>,
        /// Pin the sha256 of the release's SHA256SUMS file (`sha256sum SHA256SUMS`): the
        /// jobs refuse a release whose SHA256SUMS differs. Without it they trust the
        /// SHA256SUMS published with the release, fetched over HTTPS.
        #[arg(long, value_name = "SHA256")]
        release_sha256sums: Option<String>,
        /// Repository root (holds recipes/ and .github/).
        #[arg(long, default_value = ".")]
        root: PathBuf,
        /// Write nothing; exit 1 if a file is missing or differs from the generator's output.
        #[arg(long)]
        check: bool,
    },
}

/// One generated file: an item of `ci --json`.
#[derive(Serialize)]
struct FileStatus<'a> {
    path: &'a std::path::Path,
    status: &'static str,
}

pub fn run(args: CiArgs, printer: &Printer) -> CommandResult {
    let CiCommand::Emit {
        registry,
        cudastack_version,
        release_url,
        release_sha256sums,
        root,
        check,
    } = args.command;
    // A check compares with the options the committed files were generated with; what the
    // command line gives overrides them.
    let mut options = check
        .then(|| fs_err::read_to_string(root.join(PUBLISH_PATH)).ok())
        .flatten()
        .and_then(|text| WorkflowOptions::from_header(&text))
        .unwrap_or_default();
    options.registry = registry.or(options.registry);
    options.cudastack_version = cudastack_version.unwrap_or(options.cudastack_version);
    options.release_url = release_url.or(options.release_url);
    options.sha256sums = release_sha256sums.or(options.sha256sums);
    let files = generate(&root, &options)?;
    let mut report = Vec::new();
    let mut stale = Vec::new();
    for file in &files {
        let path = root.join(&file.path);
        let current = std::fs::read_to_string(&path).ok();
        let status = match &current {
            Some(text) if *text == file.contents => "unchanged",
            Some(_) => "changed",
            None => "new",
        };
        if check {
            if status != "unchanged" {
                stale.push(file.path.display().to_string());
            }
        } else if status != "unchanged" {
            if let Some(parent) = path.parent() {
                fs_err::create_dir_all(parent)?;
            }
            fs_err::write(&path, &file.contents)?;
        }
        report.push(FileStatus {
            path: &file.path,
            status,
        });
        if !printer.json {
            printer.line(format_args!("{:<9} {}", status, file.path.display()));
        }
    }
    if printer.json {
        printer.json(&report);
    }
    if !stale.is_empty() {
        printer.status(format!(
            "{} out of date with recipes/: run `{}`",
            stale.join(", "),
            options.command()
        ));
        return Ok(ExitCode::from(1));
    }
    Ok(ExitCode::SUCCESS)
}
