//! What is on this host: the NVIDIA driver and GPUs ([`driver`]), the CUDA toolkits and
//! libraries the dynamic loader can see ([`stack`]), and the Python in use ([`python`]).
//!
//! This module only *observes*; judging what it finds is `doctor`'s job, and `cudastack
//! check --detect` reuses the driver detection to pick a recipe for the machine it runs on.
//!
//! Everything is read through a [`HostRoot`]: a root directory plus an environment. On the
//! live system the root is `/` and the environment is the process's own; tests plant a
//! whole host (a `/proc/driver/nvidia/version`, a dangling `/usr/local/cuda`, two
//! `libcudnn.so.8` copies, a `LD_LIBRARY_PATH`) in a temporary directory and point a
//! `HostRoot` at it. Absolute paths found on the host (symlink targets, `PATH` and
//! `LD_LIBRARY_PATH` entries, ld.so.cache entries) are always re-rooted, so a planted host
//! never leaks into the real one. Detection never panics and never fails as a whole: a
//! missing file or tool is an observation, recorded as such.

pub mod driver;
pub mod python;
pub mod stack;

use std::collections::BTreeMap;
use std::ffi::OsStr;
use std::io::Read;
use std::path::{Component, Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

/// The host being examined: a filesystem root and the environment of the user's shell.
#[derive(Debug, Clone)]
pub struct HostRoot {
    root: PathBuf,
    env: BTreeMap<String, String>,
    live: bool,
}

impl HostRoot {
    /// The running system: root `/`, this process's environment.
    pub fn live() -> Self {
        HostRoot {
            root: PathBuf::from("/"),
            env: std::env::vars().collect(),
            live: true,
        }
    }

    /// A planted host under `root` with the given environment (`PATH`, `LD_LIBRARY_PATH`,
    /// `CONDA_PREFIX`, ...). Commands found on its `PATH` run on this machine, so a planted
    /// `nvidia-smi` can be a shell script that prints what a real one would.
    pub fn planted(root: impl Into<PathBuf>, env: BTreeMap<String, String>) -> Self {
        let root = root.into();
        let live = root == Path::new("/");
        HostRoot { root, env, live }
    }

    /// Whether this is the running system (so `libcuda.so.1` may also be found by the
    /// process's own dynamic loader).
    pub fn is_live(&self) -> bool {
        self.live
    }

    pub fn root(&self) -> &Path {
        &self.root
    }

    pub fn env(&self, name: &str) -> Option<&str> {
        self.env
            .get(name)
            .map(String::as_str)
            .filter(|v| !v.is_empty())
    }

    pub fn env_map(&self) -> &BTreeMap<String, String> {
        &self.env
    }

    /// The real location of a host path: `/usr/local/cuda` -> `<root>/usr/local/cuda`.
    /// `..` cannot climb above the root.
    pub fn path(&self, host_path: impl AsRef<Path>) -> PathBuf {
        let mut out = self.root.clone();
        let mut depth = 0usize;
        for component in host_path.as_ref().components() {
            match component {
                Component::Normal(part) => {
                    out.push(part);
                    depth += 1;
                }
                Component::ParentDir if depth > 0 => {
                    out.pop();
                    depth -= 1;
                }
                _ => {}
            }
        }
        out
    }

    /// The host path of a real location under the root (the inverse of [`HostRoot::path`]).
    pub fn host_path(&self, real: &Path) -> PathBuf {
        match real.strip_prefix(&self.root) {
            Ok(rest) => Path::new("/").join(rest),
            Err(_) => real.to_path_buf(),
        }
    }

    /// Resolve every symlink of a host path inside the root (absolute link targets are
    /// re-rooted). Returns the host path of the final target, or `None` when some link in
    /// the chain dangles (or loops).
    pub fn resolve(&self, host_path: impl AsRef<Path>) -> Option<PathBuf> {
        let mut resolved = PathBuf::from("/");
        let mut queue: Vec<std::ffi::OsString> = host_path
            .as_ref()
            .components()
            .filter_map(|c| match c {
                Component::Normal(p) => Some(p.to_os_string()),
                Component::ParentDir => Some("..".into()),
                _ => None,
            })
            .rev()
            .collect();
        let mut hops = 0;
        while let Some(part) = queue.pop() {
            if part == ".." {
                resolved.pop();
                continue;
            }
            let candidate = resolved.join(&part);
            let real = self.path(&candidate);
            match std::fs::symlink_metadata(&real) {
                Ok(meta) if meta.file_type().is_symlink() => {
                    hops += 1;
                    if hops > 40 {
                        return None;
                    }
                    let target = std::fs::read_link(&real).ok()?;
                    if target.is_absolute() {
                        resolved = PathBuf::from("/");
                    }
                    for c in target.components().rev() {
                        match c {
                            Component::Normal(p) => queue.push(p.to_os_string()),
                            Component::ParentDir => queue.push("..".into()),
                            _ => {}
                        }
                    }
                }
                Ok(_) => resolved = candidate,
                Err(_) => return None,
            }
        }
        Some(resolved)
    }

    /// Read a small text file of the host (`/proc/...`, `version.json`); `None` if absent.
    /// Links are followed inside the root, never out of it.
    pub fn read_text(&self, host_path: impl AsRef<Path>) -> Option<String> {
        let resolved = self.resolve(host_path)?;
        std::fs::read_to_string(self.path(resolved)).ok()
    }

    /// Split a `:`-separated path variable into its non-empty entries, in order.
    pub fn path_list(&self, variable: &str) -> Vec<PathBuf> {
        self.env(variable)
            .map(|value| {
                value
                    .split(':')
                    .filter(|entry| !entry.is_empty())
                    .map(PathBuf::from)
                    .collect()
            })
            .unwrap_or_default()
    }

    /// The first executable called `name` on the host's `PATH`, as a host path.
    pub fn which(&self, name: &str) -> Option<PathBuf> {
        use std::os::unix::fs::PermissionsExt;
        self.path_list("PATH").into_iter().find_map(|dir| {
            let candidate = dir.join(name);
            let real = self.path(&candidate);
            let meta = std::fs::metadata(&real).ok()?;
            (meta.is_file() && meta.permissions().mode() & 0o111 != 0).then_some(candidate)
        })
    }

    /// Run a host command (found by [`HostRoot::which`]) with the host's environment,
    /// killing it after `timeout`.
    pub fn run(&self, host_program: &Path, args: &[&str], timeout: Duration) -> CommandOutcome {
        let mut command = Command::new(self.path(host_program));
        command
            .args(args)
            .env_clear()
            .envs(&self.env)
            .stdin(Stdio::null());
        run_with_timeout(command, timeout)
    }
}

/// What running a command gave.
#[derive(Debug, Clone)]
pub enum CommandOutcome {
    /// It ran to the end (any exit status).
    Exited {
        code: Option<i32>,
        stdout: String,
        stderr: String,
    },
    /// It could not be started.
    NotStarted(String),
    /// It ran past its time and was killed.
    TimedOut(Duration),
}

impl CommandOutcome {
    /// Stdout of a successful run.
    pub fn success_stdout(&self) -> Option<&str> {
        match self {
            CommandOutcome::Exited {
                code: Some(0),
                stdout,
                ..
            } => Some(stdout),
            _ => None,
        }
    }

    /// Everything the command said, for evidence.
    pub fn describe(&self) -> String {
        match self {
            CommandOutcome::Exited {
                code,
                stdout,
                stderr,
            } => {
                let code = code.map_or("killed by a signal".to_string(), |c| format!("exit {c}"));
                let text = format!("{}{}", stdout.trim_end(), stderr.trim_end());
                if text.is_empty() {
                    code
                } else {
                    format!("{code}: {}", text.trim())
                }
            }
            CommandOutcome::NotStarted(error) => format!("could not start: {error}"),
            CommandOutcome::TimedOut(after) => format!("timed out after {}s", after.as_secs()),
        }
    }
}

/// Run a command, capturing output, with a deadline. Output is read on threads so a chatty
/// command cannot block on a full pipe.
pub fn run_with_timeout(mut command: Command, timeout: Duration) -> CommandOutcome {
    command.stdout(Stdio::piped()).stderr(Stdio::piped());
    let mut child = match command.spawn() {
        Ok(child) => child,
        Err(error) => return CommandOutcome::NotStarted(error.to_string()),
    };
    let reader = |stream: Option<Box<dyn Read + Send>>| {
        std::thread::spawn(move || {
            let mut text = Vec::new();
            if let Some(mut stream) = stream {
                // Bounded: a runaway command cannot fill memory.
                let _ = stream.by_ref().take(4 << 20).read_to_end(&mut text);
            }
            String::from_utf8_lossy(&text).into_owned()
        })
    };
    let stdout = reader(
        child
            .stdout
            .take()
            .map(|s| Box::new(s) as Box<dyn Read + Send>),
    );
    let stderr = reader(
        child
            .stderr
            .take()
            .map(|s| Box::new(s) as Box<dyn Read + Send>),
    );
    let started = Instant::now();
    let status = loop {
        match child.try_wait() {
            Ok(Some(status)) => break Some(status),
            Ok(None) if started.elapsed() >= timeout => {
                let _ = child.kill();
                let _ = child.wait();
                break None;
            }
            Ok(None) => std::thread::sleep(Duration::from_millis(15)),
            Err(_) => break None,
        }
    };
    let stdout = stdout.join().unwrap_or_default();
    let stderr = stderr.join().unwrap_or_default();
    match status {
        Some(status) => CommandOutcome::Exited {
            code: status.code(),
            stdout,
            stderr,
        },
        None => CommandOutcome::TimedOut(timeout),
    }
}

/// The entries of a host directory whose name satisfies `keep`, as host paths under
/// `host_dir`, sorted by name. The directory is resolved inside the root first, so a planted
/// `/usr/local/cuda -> /usr/local/cuda-12.1` never lists the real machine's directory.
pub(crate) fn list_dir(
    host: &HostRoot,
    host_dir: &Path,
    keep: impl Fn(&OsStr) -> bool,
) -> Vec<PathBuf> {
    let Some(resolved) = host.resolve(host_dir) else {
        return Vec::new();
    };
    let mut names: Vec<PathBuf> = std::fs::read_dir(host.path(resolved))
        .map(|entries| {
            entries
                .filter_map(Result::ok)
                .filter(|entry| keep(&entry.file_name()))
                .map(|entry| host_dir.join(entry.file_name()))
                .collect()
        })
        .unwrap_or_default();
    names.sort();
    names
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn paths_are_rerooted_and_cannot_escape() {
        let host = HostRoot::planted("/tmp/plant", BTreeMap::new());
        assert_eq!(
            host.path("/usr/local/cuda"),
            Path::new("/tmp/plant/usr/local/cuda")
        );
        assert_eq!(
            host.path("/../../etc/passwd"),
            Path::new("/tmp/plant/etc/passwd")
        );
        assert_eq!(
            host.host_path(Path::new("/tmp/plant/usr/lib")),
            Path::new("/usr/lib")
        );
    }

    #[test]
    fn resolve_follows_absolute_links_inside_the_root() {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path();
        std::fs::create_dir_all(root.join("usr/local/cuda-12.1/lib64")).unwrap();
        std::os::unix::fs::symlink("/usr/local/cuda-12.1", root.join("usr/local/cuda")).unwrap();
        std::os::unix::fs::symlink("/usr/local/cuda-11.8", root.join("usr/local/stale")).unwrap();
        let host = HostRoot::planted(root, BTreeMap::new());
        assert_eq!(
            host.resolve("/usr/local/cuda/lib64"),
            Some(PathBuf::from("/usr/local/cuda-12.1/lib64"))
        );
        assert_eq!(host.resolve("/usr/local/stale"), None);
    }

    #[test]
    fn planted_links_never_reach_the_real_machine() {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path();
        std::fs::create_dir_all(root.join("etc")).unwrap();
        std::os::unix::fs::symlink("/etc", root.join("config")).unwrap();
        std::os::unix::fs::symlink("/etc/passwd", root.join("name")).unwrap();
        let host = HostRoot::planted(root, BTreeMap::new());
        // The real /etc has entries; the planted one is empty.
        assert!(list_dir(&host, Path::new("/config"), |_| true).is_empty());
        assert_eq!(host.read_text("/name"), None);
    }

    #[test]
    fn commands_time_out_instead_of_hanging() {
        let mut command = Command::new("sleep");
        command.arg("5");
        let outcome = run_with_timeout(command, Duration::from_millis(200));
        assert!(
            matches!(outcome, CommandOutcome::TimedOut(_)),
            "{outcome:?}"
        );
    }
}
