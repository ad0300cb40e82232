//! `cudastack lock RECIPE...`: resolve every artifact to a URL and sha256, written to
//! RECIPE's `.lock` beside it.

use std::path::PathBuf;
use std::process::ExitCode;

use clap::Args;
use cudastack::fetch::http::HttpClient;
use cudastack::lock::inputs::{lock_request_for, platform_lock_path};
use cudastack::lock::resolve;
use cudastack::matrix::validate::validate;
use cudastack::recipe::Recipe;
use serde::Serialize;

use super::{CommandResult, Printer};

#[derive(Debug, Args)]
pub struct LockArgs {
    /// Recipe files (YAML); each gets NAME.lock beside it.
    #[arg(required = true)]
    recipes: Vec<PathBuf>,
    /// A local directory of wheels searched before any index (air-gapped sites). Its
    /// files are locked as `file://` URLs; `cudastack build --mirror DIR` reads them, and no
    /// other local file (an index cannot point `lock` at one).
    #[arg(long)]
    mirror: Option<PathBuf>,
}

/// One lock file written: an item of `lock --json` (keys in alphabetical order, as they
/// have always been printed).
#[derive(Serialize)]
struct Written<'a> {
    artifacts: usize,
    lock: PathBuf,
    platform: &'static str,
    recipe: &'a PathBuf,
    recipe_digest: cudastack::digest::Digest,
}

pub fn run(args: LockArgs, printer: &Printer) -> CommandResult {
    let loaded = super::matrix::load(printer)?;
    let matrix = loaded.matrix();
    let runtime = tokio::runtime::Runtime::new()?;
    let client = runtime.block_on(async { HttpClient::with_defaults() })?;
    let mut written = Vec::new();
    for path in &args.recipes {
        let recipe = Recipe::load(path)?;
        let validation = validate(matrix, &recipe);
        if !validation.is_valid() {
            let first = validation
                .errors()
                .next()
                .map(|p| format!("{}: {}", p.code, p.what))
                .unwrap_or_default();
            return Err(format!(
                "{} is not valid ({first}); run `cudastack validate {}`",
                path.display(),
                path.display()
            )
            .into());
        }
        // What a two-part torch version was taken to mean (issue 24), before the lock
        // records the exact release.
        for note in validation
            .problems
            .iter()
            .filter(|p| p.code == "torch-series")
        {
            printer.status(format!("note: {}", note.what));
        }
        // One lock per platform: NAME.lock (linux/amd64), NAME.linux-arm64.lock, ...
        for platform in recipe.platforms() {
            printer.status(format!("locking {} for {platform} ...", path.display()));
            let request =
                lock_request_for(matrix, &recipe, &client, args.mirror.as_deref(), platform)?;
            let lockfile = runtime.block_on(resolve(&client, &request))?;
            let out = platform_lock_path(path, platform);
            lockfile.write(&out)?;
            printer.status(format!(
                "wrote {} ({} artifacts)",
                out.display(),
                lockfile.artifacts.len()
            ));
            written.push(Written {
                artifacts: lockfile.artifacts.len(),
                lock: out,
                platform: platform.as_str(),
                recipe: path,
                recipe_digest: lockfile.recipe_digest,
            });
        }
    }
    if printer.json {
        printer.json(&written);
    } else {
        for item in &written {
            printer.line(item.lock.display());
        }
    }
    Ok(ExitCode::SUCCESS)
}
