//! `cudastack init`: a new training project's recipe, commented, with the stack `solve`
//! picks for the team's nodes and the parts every team image has (requirements, code, a
//! non-root user, an entrypoint), checked by the same validation `validate` runs before a
//! byte is written. The files a project already has (its requirements, its code, its
//! `.dockerignore`) are kept; the recipe itself is never replaced.

use std::path::{Path, PathBuf};

use crate::matrix::solve::{solve, SolveQuery};
use crate::matrix::{Matrix, ResolvedRecipe};

/// Never copied into the image, whatever the project's .dockerignore says: the layouts
/// builds write (which would grow each image by the last one), the VCS, virtualenvs and
/// the files that hold credentials.
const COPY_EXCLUDES: &str =
    "images/, .git/, .venv/, \"**/__pycache__\", .env, \".env.*\", .netrc, \"*.key\", \"*.pem\"";

/// The recipe's file name in the project.
pub const RECIPE_FILE: &str = "cudastack.yaml";
/// Its lock, beside it.
const LOCK_FILE: &str = "cudastack.lock";

/// One file `init` writes, unless the project has it.
#[derive(Debug, Clone)]
pub struct InitFile {
    pub path: PathBuf,
    pub text: String,
    /// The project had it: left as it was.
    pub kept: bool,
}

/// What `init` wrote (or would write), and the stack it picked.
#[derive(Debug, Clone)]
pub struct Initialised {
    pub recipe: PathBuf,
    pub files: Vec<InitFile>,
    /// The torch build the stack is (`2.4.1+cu121`).
    pub torch_build: String,
    /// What the pick means for the nodes (`needs driver >= ...`), when no driver was given.
    pub notes: Vec<String>,
}

#[derive(Debug, thiserror::Error)]
pub enum InitError {
    #[error("`{}` exists; cudastack init never replaces a recipe\n  hint: edit it, or run init in another directory", .0.display())]
    RecipeExists(PathBuf),
    #[error("no torch build fits {query}\n  hint: `cudastack solve` with the same options says why each build was rejected")]
    NothingFits { query: String },
    #[error("`{name}` cannot name an image: {why}\n  hint: give --name with lowercase letters, digits, `.`, `_` or `-`")]
    BadName { name: String, why: String },
    #[error("the recipe init made does not validate (a bug in cudastack; please report it):\n{0}")]
    Invalid(String),
    #[error("cannot write `{}`: {source}", .path.display())]
    Write {
        path: PathBuf,
        source: std::io::Error,
    },
}

/// Plan the project in `dir` for `query` (the nodes' driver and GPUs, a torch and Python
/// wish), the image named `name` (default: the directory's name).
pub fn plan(
    matrix: &Matrix,
    query: &SolveQuery,
    dir: &Path,
    name: Option<&str>,
) -> Result<Initialised, InitError> {
    let recipe_path = dir.join(RECIPE_FILE);
    if recipe_path.symlink_metadata().is_ok() {
        return Err(InitError::RecipeExists(recipe_path));
    }
    let name = image_name(dir, name)?;
    let solution = solve(matrix, query);
    let best = solution.best().ok_or_else(|| InitError::NothingFits {
        query: describe(query),
    })?;
    let stack = best.recipe.as_deref().unwrap_or_default();
    let text = recipe_text(&name, stack, query);
    check(matrix, &text, &recipe_path)?;
    // What solve said about its pick (the index it ranked for, a better build elsewhere).
    let mut notes = solution.notes.clone();
    if query.driver.is_none() {
        if let Some(floor) = stack.lines().find_map(|l| l.strip_prefix("driver_floor: ")) {
            notes.push(format!(
                "no --driver given: this stack needs driver {} or newer on the nodes; `cudastack init --driver V` fits it to yours",
                floor.trim_matches('"')
            ));
        }
    }
    let files = [
        (RECIPE_FILE, text),
        ("requirements.txt", REQUIREMENTS.to_string()),
        ("train.py", TRAIN.to_string()),
        (".dockerignore", DOCKERIGNORE.to_string()),
    ]
    .into_iter()
    .map(|(file, text)| {
        let path = dir.join(file);
        InitFile {
            kept: path.exists(),
            path,
            text,
        }
    })
    .collect();
    Ok(Initialised {
        recipe: recipe_path,
        files,
        torch_build: best.torch_build.clone(),
        notes,
    })
}

/// Write the files the project does not have; the recipe last, so a failure leaves no
/// recipe naming files that are not there.
pub fn write(initialised: &Initialised) -> Result<(), InitError> {
    let mut files: Vec<&InitFile> = initialised.files.iter().filter(|f| !f.kept).collect();
    files.sort_by_key(|file| file.path == initialised.recipe);
    for file in files {
        let written = if file.path == initialised.recipe {
            write_new(&file.path, &file.text)
        } else {
            crate::atomic_file::write(&file.path, file.text.as_bytes())
        };
        written.map_err(|source| InitError::Write {
            path: file.path.clone(),
            source,
        })?;
    }
    Ok(())
}

/// `text` as a new file at `path`, whole or not at all: written to a temporary file beside
/// it, then hard-linked into place, which fails when anything (a file, a link) has appeared
/// there since the plan, so it is never replaced; a SIGTERM leaves no half recipe.
fn write_new(path: &Path, text: &str) -> std::io::Result<()> {
    use std::io::Write;
    let dir = path.parent().filter(|d| !d.as_os_str().is_empty());
    let mut temporary = tempfile::NamedTempFile::new_in(dir.unwrap_or(Path::new(".")))?;
    temporary.write_all(text.as_bytes())?;
    temporary.as_file().sync_all()?;
    std::fs::hard_link(temporary.path(), path).map_err(|error| match error.kind() {
        std::io::ErrorKind::AlreadyExists => std::io::Error::new(
            error.kind(),
            "it appeared since init looked; cudastack init never replaces a recipe",
        ),
        _ => error,
    })
}

/// `--name`, or the directory's own name made an image name (`My Project` -> `my-project`).
fn image_name(dir: &Path, name: Option<&str>) -> Result<String, InitError> {
    let given = match name {
        Some(name) => name.to_string(),
        None => {
            let absolute = std::path::absolute(dir).unwrap_or_else(|_| dir.to_path_buf());
            let base = absolute
                .file_name()
                .and_then(|n| n.to_str())
                .unwrap_or("train")
                .to_lowercase();
            let mapped: String = base
                .chars()
                .map(|c| match c {
                    'a'..='z' | '0'..='9' | '.' | '_' | '-' => c,
                    _ => '-',
                })
                .collect();
            let trimmed = mapped.trim_matches(|c: char| !c.is_ascii_alphanumeric());
            if trimmed.is_empty() {
                "train".to_string()
            } else {
                trimmed.to_string()
            }
        }
    };
    crate::recipe::check_name(&given).map_err(|why| InitError::BadName {
        name: given.clone(),
        why,
    })?;
    Ok(given)
}

/// The solved stack's recipe lines under the team's parts, each commented.
fn recipe_text(name: &str, stack: &str, query: &SolveQuery) -> String {
    let solved_with = describe(query);
    let stack_lines: String = stack
        .lines()
        .filter(|line| !line.starts_with("name:"))
        .map(|line| format!("{line}\n"))
        .collect();
    format!(
        "# A training image, made by `cudastack init`. Next:\n\
         #   cudastack lock {RECIPE_FILE}     # every wheel and .deb pinned by sha256 ({LOCK_FILE})\n\
         #   cudastack build {RECIPE_FILE}    # the image: images/{name}, verified, --load for Docker\n\
         # The recipe's reference: README.md and docs/training-image.md of cudastack.\n\
         name: {name}\n\
         \n\
         # The stack: what `cudastack solve{solved_with}` ranks first (its layers are shared\n\
         # with every image on the same stack). Change it by solving again.\n\
         {stack_lines}\
         \n\
         # Your Python dependencies, pip's format (-r, -c, --hash, markers), locked by sha256.\n\
         # Or `pyproject: {{ path: pyproject.toml }}`, or `python_lock: uv.lock`.\n\
         requirements: [requirements.txt]\n\
         \n\
         # Debian packages, locked with the base:\n\
         # apt: [git]\n\
         # Your certificate authority, when a TLS-inspecting proxy sits between you and PyPI:\n\
         # ca_certificates: [certs/corp-root.pem]\n\
         \n\
         # Your code: this directory, less what .dockerignore and `exclude` name (builds, the\n\
         # VCS, secrets), in the image's top layer (a code change rebuilds that layer alone).\n\
         copy:\n  - {{ src: ., dst: /workspace, exclude: [{COPY_EXCLUDES}] }}\n\
         # The image runs as this user, not root.\n\
         user: {{ name: trainer, uid: 1000 }}\n\
         workdir: /workspace\n\
         entrypoint: [python, /workspace/train.py]\n\
         \n\
         # What the run needs: NCCL keeps its buffers in /dev/shm (Docker gives 64 MiB).\n\
         runtime: {{ shm_size: 16g }}\n"
    )
}

/// ` --driver V --gpu NAME ...` as the query was given (empty for none).
fn describe(query: &SolveQuery) -> String {
    let mut text = String::new();
    if let Some(driver) = &query.driver {
        text.push_str(&format!(" --driver {driver}"));
    }
    for gpu in &query.gpus {
        text.push_str(&format!(" --gpu \"{}\"", gpu.recipe_entry()));
    }
    if let Some(torch) = &query.torch {
        text.push_str(&format!(" --torch \"{torch}\""));
    }
    if let Some(python) = &query.python {
        text.push_str(&format!(" --python {python}"));
    }
    text
}

/// The recipe validates as `validate` would validate it.
fn check(matrix: &Matrix, text: &str, path: &Path) -> Result<(), InitError> {
    let recipe = crate::recipe::Recipe::parse(text, path)
        .map_err(|error| InitError::Invalid(error.to_string()))?;
    ResolvedRecipe::new(matrix, recipe, path)
        .map(|_| ())
        .map_err(|invalid| InitError::Invalid(invalid.to_string()))
}

const REQUIREMENTS: &str = "\
# Your Python dependencies, pip's format. torch and its CUDA libraries come with the stack:
# do not list them here. Each line is locked by sha256 (`cudastack lock`).
# numpy==2.1.3
# transformers>=4.46,<5
";

const TRAIN: &str = r#"""The image's entrypoint: replace with your training script."""

import torch


def main() -> None:
    print(f"torch {torch.__version__}, CUDA {torch.version.cuda}")
    if torch.cuda.is_available():
        print(f"{torch.cuda.device_count()} GPU(s): {torch.cuda.get_device_name(0)}")
    else:
        print("no GPU visible: run with --gpus all (Docker) or a GPU request (Kubernetes)")


if __name__ == "__main__":
    main()
"#;

const DOCKERIGNORE: &str = "\
# Not copied into the image (`copy:` reads this file).
.git
.venv
__pycache__
*.pyc
images/
";
