//! `cudastack solve --driver V --gpu NAME [--torch SPEC] [--python X.Y] [--index WHERE]`

use std::path::{Path, PathBuf};
use std::process::ExitCode;

use clap::Args;
use cudastack::matrix::solve::{solve, Candidate, Reach, RejectedBy, Solution, SolveQuery};
use cudastack::matrix::Status;
use cudastack::version::{DriverVersion, PythonVersion};

use super::{CommandResult, Printer};

#[derive(Debug, Args)]
pub struct SolveArgs {
    /// The host's NVIDIA driver version (`nvidia-smi --query-gpu=driver_version --format=csv`).
    #[arg(long)]
    driver: Option<DriverVersion>,
    /// A GPU the stack must run on, by name (`RTX 3090`, `A10G`, `NVIDIA H100 80GB HBM3`;
    /// known names: `cudastack matrix --table gpus`); repeatable.
    #[arg(long = "gpu")]
    gpus: Vec<String>,
    /// A GPU given by compute capability (`8.6` or `sm_86`); repeatable.
    #[arg(long = "cc")]
    ccs: Vec<String>,
    /// Torch versions to consider: `2.4.1` (exact), `2.4` (the 2.4 series: its newest
    /// release that fits), `>=2.3,<2.6`.
    #[arg(long)]
    torch: Option<String>,
    /// Python version the stack must use.
    #[arg(long)]
    python: Option<PythonVersion>,
    /// The torch indexes the host that runs `cudastack lock` reaches: `pypi` (PyPI only,
    /// what a recipe without `index:` locks from), `pytorch` (download.pytorch.org too),
    /// one of its indexes (`cu121`, or a mirror's URL ending in /cu121), or the root of a
    /// mirror of them (`https://mirror.example/whl/`). Builds on other indexes rank after
    /// the ones it reaches; nothing is probed.
    #[arg(long, value_name = "WHERE", default_value = "pypi")]
    index: Reach,
    /// Reject builds that need CUDA minor-version compatibility on this driver.
    #[arg(long)]
    no_minor_compat: bool,
    /// How many accepted and rejected candidates to show (all with --json).
    #[arg(long, default_value_t = 5)]
    top: usize,
    /// Write the best answer's recipe to FILE (a new file; `cudastack lock FILE` next).
    #[arg(long, value_name = "FILE")]
    write: Option<PathBuf>,
}

#[derive(serde::Serialize)]
struct SolveJson<'a> {
    #[serde(flatten)]
    solution: &'a Solution,
    matrix: &'a cudastack::matrix::source::Origin,
}

pub fn run(args: SolveArgs, printer: &Printer) -> CommandResult {
    let loaded = super::matrix::load(printer)?;
    let matrix = loaded.matrix();
    let mut query = SolveQuery {
        driver: args.driver,
        python: args.python,
        allow_minor_compat: !args.no_minor_compat,
        index: args.index,
        ..Default::default()
    };
    for name in args.gpus.iter().chain(&args.ccs) {
        query.gpus.push(SolveQuery::gpu(matrix, name)?);
    }
    if let Some(spec) = &args.torch {
        query.torch = Some(SolveQuery::torch_spec(spec)?);
    }
    let solution = solve(matrix, &query);
    if let Some(path) = &args.write {
        write_recipe(&solution, path, printer)?;
    }
    if printer.json {
        // Which matrix answered rides along (`"matrix": {"source": "refreshed", ...}`).
        printer.json(&SolveJson {
            solution: &solution,
            matrix: &loaded.origin,
        });
        return Ok(if solution.best().is_some() {
            ExitCode::SUCCESS
        } else {
            ExitCode::from(1)
        });
    }
    print_human(&solution, args.top, printer);
    Ok(if solution.accepted().next().is_none() {
        ExitCode::from(1)
    } else {
        ExitCode::SUCCESS
    })
}

/// `--write`: the best answer's recipe into a new file. An existing file is never replaced
/// (it may be a recipe with a lock beside it). No answer writes nothing: the output says why.
fn write_recipe(solution: &Solution, path: &Path, printer: &Printer) -> Result<(), BoxError> {
    let Some(recipe) = solution.best().and_then(|best| best.recipe.as_deref()) else {
        printer.status(format!(
            "no build fits, so no recipe was written to `{}`",
            path.display()
        ));
        return Ok(());
    };
    if path.exists() {
        return Err(format!(
            "`{}` exists; cudastack does not replace it\n  hint: remove it, or give another file to --write",
            path.display()
        )
        .into());
    }
    cudastack::atomic_file::write(path, recipe.as_bytes())
        .map_err(|e| format!("failed to write `{}`: {e}", path.display()))?;
    printer.status(format!(
        "wrote the recipe to `{}`; next: cudastack lock {}",
        path.display(),
        path.display()
    ));
    if let Some(best) = solution.best().filter(|best| !best.reachable) {
        printer.status(format!(
            "  note: its torch is on PyTorch's {} index, which `--index {}` does not reach: the lock needs that index (or a mirror of it) reachable",
            best.variant, solution.index
        ));
    }
    Ok(())
}

type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// The human output: the host, the accepted candidates (best first) with their reasons,
/// the rejected ones (newest first), and the recipe of the best answer.
fn print_human(solution: &Solution, top: usize, printer: &Printer) {
    let mut host = Vec::new();
    if let Some(driver) = &solution.driver {
        host.push(format!(
            "driver {driver} (CUDA <= {})",
            solution
                .cuda_ceiling
                .map(|c| c.to_string())
                .unwrap_or_else(|| "none".into())
        ));
    }
    for gpu in &solution.gpus {
        host.push(format!("{} (compute capability {})", gpu.name, gpu.cc));
    }
    if !host.is_empty() {
        printer.line(format_args!("host: {}", host.join(", ")));
    }
    for note in &solution.notes {
        printer.line(format_args!("note: {note}"));
    }
    // A GPU the driver does not support rules out every build: say it once, with what to do.
    let mut driver_unsupported = false;
    if let Some(driver) = &solution.driver {
        for drivers in solution.gpu_drivers.iter().filter(|d| !d.runs_on(driver)) {
            driver_unsupported = true;
            printer.line(format_args!(
                "driver does not support the GPU: {}\n  hint: {}",
                drivers.refusal(driver),
                drivers.hint(driver)
            ));
        }
    }
    // Without a driver, say what the hosts of these GPUs need (the recipe's floor has it).
    if solution.driver.is_none() {
        for drivers in &solution.gpu_drivers {
            printer.line(format_args!(
                "note: {} needs {} ({})",
                drivers.gpu,
                drivers.requirement(),
                drivers.status
            ));
        }
    }
    let accepted: Vec<_> = solution.accepted().collect();
    if accepted.is_empty() {
        printer.line("no torch build fits.");
        let limited = solution
            .candidates
            .iter()
            .filter(|c| c.rejected_by == Some(RejectedBy::CudastackLimit))
            .count();
        for limit in &solution.limits {
            printer.line(format_args!(
                "  cudastack's limit, not the stack's: {limit} ({limited} builds the stack would run are ruled out by it)"
            ));
        }
    } else {
        printer.line(format_args!(
            "\naccepted ({} in all, best first):",
            accepted.len()
        ));
        for (rank, candidate) in accepted.iter().take(top).enumerate() {
            let compat = if candidate.minor_compat {
                " [minor-version compat]"
            } else {
                ""
            };
            let reach = if candidate.reachable {
                String::new()
            } else {
                format!(" [not on --index {}]", solution.index)
            };
            printer.line(format_args!(
                "  {}. torch {} (index {}, CUDA {}, cuDNN {}, {}){compat}{reach}",
                rank + 1,
                candidate.torch_build,
                candidate.index,
                candidate.cuda,
                candidate.cudnn.as_deref().unwrap_or("-"),
                candidate.status
            ));
            for reason in &candidate.reasons {
                printer.line(format_args!("       - {reason}"));
            }
        }
    }
    print_legend(
        accepted.iter().take(top).map(|c| c.status.as_str()),
        printer,
    );
    // What rules a build out: the query or a compatibility fact, apart from the limits of
    // cudastack's own (builds the stack would run, which cudastack cannot lock).
    let (limited, rejected): (Vec<_>, Vec<_>) = solution
        .candidates
        .iter()
        .filter(|c| !c.accepted)
        .partition(|c| c.rejected_by == Some(RejectedBy::CudastackLimit));
    if driver_unsupported {
        printer.line(format_args!(
            "\nrejected: all {} builds, for the reason above (`--json` lists them)",
            rejected.len() + limited.len()
        ));
    } else {
        print_rejected("rejected", &rejected, top, printer);
        print_rejected(
            "ruled out by cudastack's own limits, not by compatibility",
            &limited,
            top,
            printer,
        );
    }
    if accepted.is_empty() && solution.changes.is_empty() {
        printer.line(
            "\nno single change (a driver, a Python, a GPU left out or replaced, any torch) makes a build fit",
        );
    }
    if !solution.changes.is_empty() {
        printer.line("\nsmallest changes that make a build fit:");
        for change in &solution.changes {
            printer.line(format_args!(
                "  - {}: torch {} (index {})",
                change.change, change.torch_build, change.index
            ));
        }
    }
    if let Some(best) = accepted.first().and_then(|c| c.recipe.as_ref()) {
        printer.line(format_args!("\nrecipe for the best answer:\n---\n{best}"));
    }
}

/// A list of rejected builds under `title`, newest first, the first `top` shown.
fn print_rejected(title: &str, rejected: &[&Candidate], top: usize, printer: &Printer) {
    if rejected.is_empty() {
        return;
    }
    printer.line(format_args!(
        "\n{title} ({} in all, newest first):",
        rejected.len()
    ));
    for candidate in rejected.iter().take(top) {
        printer.line(format_args!(
            "  - torch {}: {}",
            candidate.torch_build,
            candidate.reasons.join("; ")
        ));
    }
}

/// What the status words of the shown rows mean (an unconfirmed answer says so).
fn print_legend<'a>(shown: impl Iterator<Item = &'a str>, printer: &Printer) {
    let shown: Vec<&str> = shown.collect();
    let statuses = Status::ALL
        .into_iter()
        .filter(|status| shown.contains(&status.word()));
    for line in super::matrix::status_legend(statuses) {
        printer.line(format_args!("  {line}"));
    }
}
