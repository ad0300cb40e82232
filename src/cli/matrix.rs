//! `cudastack matrix [--torch SPEC] [--cuda X.Y] [--gpu NAME] [--table T]` and
//! `cudastack matrix refresh`.

use std::process::ExitCode;

use clap::{Args, Subcommand, ValueEnum};
use comfy_table::{presets::UTF8_BORDERS_ONLY, Table};
use cudastack::cache::default_cache_root;
use cudastack::matrix::solve::SolveQuery;
use cudastack::matrix::source::{self, LoadedMatrix, Origin};
use cudastack::matrix::{KernelSupport, Matrix, Status};
use cudastack::version::{ComputeCapability, CudaVersion};
use serde::Serialize;

use super::{Async, CommandResult, Printer};

#[derive(Debug, Args)]
#[command(args_conflicts_with_subcommands = true)]
pub struct MatrixArgs {
    #[command(subcommand)]
    command: Option<MatrixCommand>,
    /// Which table to show.
    #[arg(long, value_enum, default_value_t = TableKind::Torch)]
    table: TableKind,
    /// Only torch builds matching this version or specifier (`2.4.1`, `>=2.5`).
    #[arg(long)]
    torch: Option<String>,
    /// Only rows for this CUDA version (`12.4`).
    #[arg(long)]
    cuda: Option<CudaVersion>,
    /// Only torch builds with native kernels for this GPU (name or compute capability).
    #[arg(long)]
    gpu: Option<String>,
}

#[derive(Debug, Clone, Copy, ValueEnum)]
enum TableKind {
    /// torch builds: CUDA, cuDNN, Python tags, sm list (default).
    Torch,
    /// CUDA toolkit -> minimum Linux driver, and minor-version-compatibility floors.
    Cuda,
    /// cuDNN release ranges -> CUDA majors.
    Cudnn,
    /// GPUs -> compute capability.
    Gpus,
}

#[derive(Debug, Subcommand)]
enum MatrixCommand {
    /// Read the torch releases from PyPI into the cache; every command then uses them.
    Refresh(super::refresh::RefreshArgs),
}

/// The matrix a command uses: a refreshed one from the cache (`matrix refresh`) when it is
/// current, else the one built in. Notes (an outdated refreshed file ignored) and, for
/// commands other than `matrix`, which matrix answers go to stderr.
pub(super) fn load(printer: &Printer) -> Result<LoadedMatrix, source::SourceError> {
    load_from(&default_cache_root(), printer)
}

/// [`load`] from a given cache root (`build --cache-dir`).
pub(super) fn load_from(
    cache_root: &std::path::Path,
    printer: &Printer,
) -> Result<LoadedMatrix, source::SourceError> {
    let loaded = source::load(cache_root)?;
    announce(&loaded, printer);
    Ok(loaded)
}

fn announce(loaded: &LoadedMatrix, printer: &Printer) {
    for note in &loaded.notes {
        printer.status(note);
    }
    if matches!(loaded.origin, Origin::Refreshed { .. }) {
        printer.status(format!("matrix: {}", loaded.origin));
    }
}

/// `matrix --json`: which matrix answered, and the rows of the table asked for.
#[derive(Serialize)]
struct JsonTable<'a, T: Serialize> {
    matrix: &'a Origin,
    rows: T,
}

fn print_json<T: Serialize>(origin: &Origin, rows: T, printer: &Printer) {
    printer.json(&JsonTable {
        matrix: origin,
        rows,
    });
}

pub fn run(args: MatrixArgs, runtime: &Async, printer: &Printer) -> CommandResult {
    if let Some(MatrixCommand::Refresh(refresh)) = args.command {
        return super::refresh::run(refresh, runtime, printer);
    }
    let loaded = source::load(&default_cache_root())?;
    for note in &loaded.notes {
        printer.status(note);
    }
    if !printer.json {
        printer.line(format_args!("matrix: {}", loaded.origin));
    }
    let matrix = loaded.matrix();
    let origin = &loaded.origin;
    match args.table {
        TableKind::Torch => torch_table(matrix, origin, &args, printer),
        TableKind::Cuda => cuda_table(matrix, origin, &args, printer),
        TableKind::Cudnn => cudnn_table(matrix, origin, printer),
        TableKind::Gpus => gpu_table(matrix, origin, printer),
    }
}

fn new_table(header: &[&str]) -> Table {
    let mut table = Table::new();
    table
        .load_style(UTF8_BORDERS_ONLY)
        .set_header(header.to_vec());
    table
}

fn torch_table(
    matrix: &Matrix,
    origin: &Origin,
    args: &MatrixArgs,
    printer: &Printer,
) -> CommandResult {
    let spec = args
        .torch
        .as_deref()
        .map(SolveQuery::torch_spec)
        .transpose()?;
    let gpu: Option<ComputeCapability> = args
        .gpu
        .as_deref()
        .map(|name| SolveQuery::gpu(matrix, name).map(|g| g.cc))
        .transpose()?;
    let rows: Vec<_> = matrix
        .torch_builds
        .iter()
        .filter(|b| spec.as_ref().is_none_or(|s| s.contains(&b.torch)))
        .filter(|b| {
            args.cuda
                .is_none_or(|c| c.matches(&b.cuda) || c.line() == b.cuda.line())
        })
        .filter(|b| gpu.is_none_or(|cc| matches!(b.kernels_for(&cc), KernelSupport::Sass(_))))
        .collect();
    if printer.json {
        print_json(origin, &rows, printer);
        return Ok(ExitCode::SUCCESS);
    }
    let mut table = new_table(&[
        "torch",
        "index",
        "CUDA",
        "runtime",
        "cuDNN",
        "python",
        "sm (SASS)",
        "status",
    ]);
    for build in &rows {
        let python = match (build.python.first(), build.python.last()) {
            (Some(first), Some(last)) if first != last => format!("{}-{}", first, last),
            (Some(only), _) => only.to_string(),
            _ => "-".into(),
        };
        let mut archs = build.arch_list.clone();
        archs.sort();
        let archs: Vec<String> = archs
            .iter()
            .map(|cc| format!("{}{}", cc.major, cc.minor))
            .collect();
        table.add_row(vec![
            build.torch.to_string(),
            if build.pypi_default {
                "pypi".into()
            } else {
                build.variant.clone()
            },
            build.cuda.to_string(),
            build.cuda_runtime.clone().unwrap_or_else(|| "-".into()),
            build
                .cudnn
                .as_ref()
                .map(ToString::to_string)
                .unwrap_or_else(|| "-".into()),
            python,
            format!(
                "{}{}",
                archs.join(" "),
                if build.ptx { " +PTX" } else { "" }
            ),
            build.status.to_string(),
        ]);
    }
    printer.line(&table);
    print_legend(rows.iter().map(|build| build.status), printer);
    Ok(ExitCode::SUCCESS)
}

#[derive(Serialize)]
struct CudaRow<'a> {
    version: CudaVersion,
    min_driver: String,
    minor_compat_floor: Option<String>,
    status: &'a cudastack::matrix::Status,
}

fn cuda_table(
    matrix: &Matrix,
    origin: &Origin,
    args: &MatrixArgs,
    printer: &Printer,
) -> CommandResult {
    let rows: Vec<CudaRow> = matrix
        .cuda_releases
        .iter()
        .rev()
        .filter(|row| {
            args.cuda
                .is_none_or(|c| c.matches(&row.version) || c.line() == row.version.line())
        })
        .map(|row| CudaRow {
            version: row.version,
            min_driver: row.min_driver.to_string(),
            minor_compat_floor: matrix
                .minor_compat_floor(row.version.major)
                .map(|m| m.min_driver.to_string()),
            status: &row.status,
        })
        .collect();
    if printer.json {
        print_json(origin, &rows, printer);
        return Ok(ExitCode::SUCCESS);
    }
    let mut table = new_table(&[
        "CUDA",
        "min driver (Linux x86_64)",
        "minor-compat floor",
        "status",
    ]);
    for row in &rows {
        table.add_row(vec![
            row.version.to_string(),
            row.min_driver.clone(),
            row.minor_compat_floor.clone().unwrap_or_default(),
            row.status.to_string(),
        ]);
    }
    printer.line(&table);
    print_legend(rows.iter().map(|row| *row.status), printer);
    printer.line(format_args!("source: {}", matrix.cuda_releases_source));
    Ok(ExitCode::SUCCESS)
}

fn cudnn_table(matrix: &Matrix, origin: &Origin, printer: &Printer) -> CommandResult {
    if printer.json {
        print_json(origin, &matrix.cudnn_ranges, printer);
        return Ok(ExitCode::SUCCESS);
    }
    let mut table = new_table(&["cuDNN from", "cuDNN to", "CUDA majors"]);
    for row in &matrix.cudnn_ranges {
        let majors: Vec<String> = row.cuda_majors.iter().map(u32::to_string).collect();
        table.add_row(vec![
            row.first.to_string(),
            row.last.to_string(),
            majors.join(", "),
        ]);
    }
    printer.line(&table);
    Ok(ExitCode::SUCCESS)
}

fn gpu_table(matrix: &Matrix, origin: &Origin, printer: &Printer) -> CommandResult {
    if printer.json {
        print_json(origin, &matrix.gpus, printer);
        return Ok(ExitCode::SUCCESS);
    }
    let mut table = new_table(&[
        "GPU",
        "compute capability",
        "architecture",
        "drivers",
        "status",
    ]);
    let mut gpus: Vec<_> = matrix.gpus.iter().collect();
    gpus.sort_by(|a, b| a.cc.cmp(&b.cc).then(a.name.cmp(&b.name)));
    for gpu in gpus {
        let name = if gpu.aliases.is_empty() {
            gpu.name.clone()
        } else {
            format!("{} (also {})", gpu.name, gpu.aliases.join(", "))
        };
        // The oldest driver that runs the GPU at all, and how sure that is.
        let target = cudastack::target_gpu::TargetGpu {
            name: gpu.name.clone(),
            cc: gpu.cc,
        };
        let min_driver = match matrix.gpu_drivers(&target) {
            Some(drivers) => {
                let min = match (&drivers.min_driver, &drivers.min_branch) {
                    (Some(min), Some(branch)) if min.to_string() == min.branch().to_string() => {
                        Some(branch.clone())
                    }
                    (Some(min), _) => Some(min.to_string()),
                    _ => None,
                };
                let last = drivers
                    .last_branch
                    .as_ref()
                    .map(|last| format!("up to {last}"));
                let range: Vec<String> = min.into_iter().chain(last).collect();
                format!("{} ({})", range.join(", "), drivers.status)
            }
            None => "-".to_string(),
        };
        table.add_row(vec![
            name,
            gpu.cc.to_string(),
            gpu.arch.clone(),
            min_driver,
            gpu.status.to_string(),
        ]);
    }
    printer.line(&table);
    print_legend(matrix.gpus.iter().map(|gpu| gpu.status), printer);
    printer.line("drivers: the oldest driver branch (or release) that runs the GPU at all, or `up to` the last branch that still does (NVIDIA's CUDA Toolkit, Driver, and Architecture Matrix); `-`: any driver of CUDA 11 or later");
    printer.line("names match forgivingly (case, spaces, `NVIDIA`/`GeForce`/`Tesla` left out); a GPU not listed can be given by its compute capability (`8.6`)");
    Ok(ExitCode::SUCCESS)
}

/// The legend of the status words present in a table, most certain first.
fn print_legend(shown: impl Iterator<Item = Status>, printer: &Printer) {
    let shown: Vec<Status> = shown.collect();
    let present = Status::ALL
        .into_iter()
        .filter(|status| shown.contains(status));
    for line in status_legend(present) {
        printer.line(line);
    }
}

/// The lines that explain status words: `status: how sure the matrix is of a row` and one
/// line per word. Nothing when no status is shown.
pub(super) fn status_legend(statuses: impl Iterator<Item = Status>) -> Vec<String> {
    let lines: Vec<String> = statuses
        .map(|status| format!("  {:<12} {}", status.word(), status.meaning()))
        .collect();
    if lines.is_empty() {
        return lines;
    }
    let mut all = vec!["status (how sure cudastack's matrix is of a row):".to_string()];
    all.extend(lines);
    all
}
