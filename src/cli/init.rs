//! `cudastack init [DIR] [--driver V] [--gpu NAME] [--detect] [--torch SPEC] [--python X.Y]`

use std::path::PathBuf;
use std::process::ExitCode;

use clap::Args;
use cudastack::matrix::solve::SolveQuery;
use cudastack::pipeline::init;
use cudastack::version::{DriverVersion, PythonVersion};

use super::{CommandResult, Printer};

#[derive(Debug, Args)]
pub struct InitArgs {
    /// The project's directory (made if absent); its code is what the image copies.
    #[arg(default_value = ".")]
    dir: PathBuf,
    /// The image's name (default: the directory's name, lowercased).
    #[arg(long)]
    name: Option<String>,
    /// The oldest driver on the nodes the image runs on.
    #[arg(long)]
    driver: Option<DriverVersion>,
    /// A GPU the image trains on, by name (`H100`, `RTX 4090`) or compute capability
    /// (`8.9`); repeatable.
    #[arg(long = "gpu")]
    gpus: Vec<String>,
    /// Read the driver and GPUs of this machine (when it is one of the nodes).
    #[arg(long)]
    detect: bool,
    /// Torch versions to consider: `2.4.1`, `2.4` (the series), `>=2.3,<2.6`.
    #[arg(long)]
    torch: Option<String>,
    /// The Python the image uses.
    #[arg(long)]
    python: Option<PythonVersion>,
}

pub fn run(args: InitArgs, printer: &Printer) -> CommandResult {
    let loaded = super::matrix::load(printer)?;
    let matrix = loaded.matrix();
    let mut query = SolveQuery {
        driver: args.driver,
        python: args.python,
        allow_minor_compat: false,
        ..Default::default()
    };
    for name in &args.gpus {
        query.gpus.push(SolveQuery::gpu(matrix, name)?);
    }
    if args.detect {
        detect(&mut query, matrix, printer);
    }
    if let Some(spec) = &args.torch {
        query.torch = Some(SolveQuery::torch_spec(spec)?);
    }
    // Planned (and refused) before anything is made: a refused init leaves no directory.
    let planned = init::plan(matrix, &query, &args.dir, args.name.as_deref())?;
    fs_err::create_dir_all(&args.dir)?;
    init::write(&planned)?;
    if printer.json {
        printer.json(&serde_json::json!({
            "recipe": planned.recipe,
            "torch_build": planned.torch_build,
            "written": planned.files.iter().filter(|f| !f.kept).map(|f| &f.path).collect::<Vec<_>>(),
            "kept": planned.files.iter().filter(|f| f.kept).map(|f| &f.path).collect::<Vec<_>>(),
            "notes": planned.notes,
        }));
        return Ok(ExitCode::SUCCESS);
    }
    for file in &planned.files {
        let what = if file.kept { "kept   " } else { "wrote  " };
        printer.line(format_args!("{what}{}", file.path.display()));
    }
    printer.line(format_args!("stack  torch {}", planned.torch_build));
    for note in &planned.notes {
        printer.line(format_args!("note: {note}"));
    }
    let recipe = shell_quoted(&planned.recipe.display().to_string());
    printer.line(format_args!(
        "next:  cudastack lock {recipe} && cudastack build {recipe} --load"
    ));
    Ok(ExitCode::SUCCESS)
}

/// This machine's driver and GPUs, as `check --detect` reads them; what is not found is
/// said, and the query keeps what was given.
fn detect(query: &mut SolveQuery, matrix: &cudastack::matrix::Matrix, printer: &Printer) {
    let report = cudastack::host::driver::detect(&cudastack::host::HostRoot::live());
    match &report.driver_version {
        Some(version) if query.driver.is_none() => query.driver = Some(version.clone()),
        Some(_) => {}
        None => printer.status("--detect: no NVIDIA driver on this machine"),
    }
    for gpu in &report.gpus {
        let cc = gpu.cc.map(|cc| cc.to_string());
        let name = cc.as_deref().unwrap_or(&gpu.name);
        match SolveQuery::gpu(matrix, name) {
            Ok(target) if !query.gpus.contains(&target) => query.gpus.push(target),
            Ok(_) => {}
            Err(error) => printer.status(format!("--detect: {error}")),
        }
    }
}

/// `text` as one shell word, quoted when it needs to be (`'Acme Train/cudastack.yaml'`).
fn shell_quoted(text: &str) -> String {
    let plain = text
        .chars()
        .all(|c| c.is_ascii_alphanumeric() || "/._-+:@".contains(c));
    if plain {
        text.to_string()
    } else {
        format!("'{}'", text.replace('\'', r"'\''"))
    }
}
