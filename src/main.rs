//! The `cudastack` binary: parse the command line, call the library, render the result.
//! Everything that decides anything lives in the library; this file and `cli/` only
//! translate between the terminal and it.

mod cli;

use std::process::ExitCode;

fn main() -> ExitCode {
    cli::main()
}
