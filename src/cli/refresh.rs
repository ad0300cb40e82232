//! `cudastack matrix refresh`: regenerate data/torch-pypi.json from PyPI.

use super::matrix::RefreshArgs;
use super::{CommandResult, Printer};

pub fn run(_args: RefreshArgs, _printer: &Printer) -> CommandResult {
    Err("matrix refresh is being wired".into())
}
