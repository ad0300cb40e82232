//! `cudastack cache`: what the cache directory holds, by kind (`--json` for the numbers),
//! and `cudastack cache prune`: remove what no build used for a while (docs/cache.md).

use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use clap::{Args, Subcommand};
use cudastack::cache::{cache_usage, prune};
use cudastack::stack::human_bytes;

use super::{CommandResult, Printer};

#[derive(Debug, Args)]
pub struct CacheArgs {
    #[command(subcommand)]
    action: Option<CacheAction>,
    /// Cache directory (default: $CUDASTACK_CACHE_DIR, else ~/.cache/cudastack).
    #[arg(long, env = "CUDASTACK_CACHE_DIR", global = true)]
    cache_dir: Option<PathBuf>,
}

#[derive(Debug, Subcommand)]
enum CacheAction {
    /// Remove staged trees, layer cache entries and blobs that no build used for DAYS
    /// days; whatever a running build holds stays. The next build that needs them stages,
    /// compresses or downloads them again.
    #[command(after_help = super::examples::CACHE_PRUNE)]
    Prune {
        /// Keep what a build used in the last DAYS days (0: remove everything not in use).
        #[arg(long, value_name = "DAYS", default_value_t = 14)]
        older_than: u32,
    },
}

pub fn run(args: CacheArgs, printer: &Printer) -> CommandResult {
    let root = cudastack::cache::cache_root(args.cache_dir);
    match args.action {
        None => {
            let usage = cache_usage(&root)?;
            if printer.json {
                printer.json(&usage);
                return Ok(ExitCode::SUCCESS);
            }
            printer.line(format_args!("cache {}", usage.root.display()));
            for (kind, usage) in &usage.kinds {
                printer.line(format_args!(
                    "  {:<26} {:>7} {:>11}",
                    kind.describe(),
                    usage.count,
                    human_bytes(usage.bytes)
                ));
            }
            printer.line(format_args!(
                "  {:<26} {:>7} {:>11}",
                "total",
                "",
                human_bytes(usage.total_bytes)
            ));
        }
        Some(CacheAction::Prune { older_than }) => {
            let days = Duration::from_secs(u64::from(older_than) * 86_400);
            let report = prune(&root, days)?;
            if printer.json {
                printer.json(&report);
                return Ok(ExitCode::SUCCESS);
            }
            for (kind, removed) in &report.removed {
                printer.line(format_args!(
                    "removed {} {} ({})",
                    removed.count,
                    kind.describe(),
                    human_bytes(removed.bytes)
                ));
            }
            if report.removed.is_empty() {
                printer.line(format_args!(
                    "nothing unused for {older_than} days in {}",
                    root.display()
                ));
            }
            if report.builds_running {
                printer.status(
                    "a build is running on this cache: only staged trees were pruned; run \
                     `cudastack cache prune` again when no build runs to prune layers and blobs",
                );
            }
            if report.kept_in_use > 0 {
                printer.status(format!(
                    "kept {} entries a running build holds",
                    report.kept_in_use
                ));
            }
        }
    }
    Ok(ExitCode::SUCCESS)
}
