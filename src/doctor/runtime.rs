//! Layer 2 of the funnel: can a GPU container start here? Docker must answer on its socket
//! (`DOCKER_HOST=unix://...` or `/var/run/docker.sock`; read with a plain HTTP/1.0 `GET
//! /info`, so no engine client is needed), and GPUs must reach containers through the
//! NVIDIA runtime (`Runtimes.nvidia` in `/info`), the `--gpus` hook
//! (`nvidia-container-runtime-hook` on `PATH`), or CDI specs (`/etc/cdi`, `/var/run/cdi`).
//! The quick GPU container (`docker run --rm --gpus all IMAGE nvidia-smi -L`) runs only when
//! an image is given: nothing is pulled.

use std::io::{Read, Write};
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::time::Duration;

use super::{DoctorOptions, Finding, Severity};
use crate::host::driver::DriverReport;
use crate::host::{list_dir, HostRoot};

/// What `GET /info` said, or why it could not be asked.
#[derive(Debug)]
pub enum DockerInfo {
    NoSocket(PathBuf),
    ConnectFailed {
        socket: PathBuf,
        error: std::io::Error,
    },
    BadAnswer {
        socket: PathBuf,
        detail: String,
    },
    Info {
        socket: PathBuf,
        info: serde_json::Value,
    },
}

/// The Docker socket of the host (`DOCKER_HOST` if it is a unix socket).
pub fn docker_socket(host: &HostRoot) -> Option<PathBuf> {
    match host.env("DOCKER_HOST") {
        Some(value) => value.strip_prefix("unix://").map(PathBuf::from),
        None => Some(PathBuf::from("/var/run/docker.sock")),
    }
}

/// Ask the Docker Engine for `/info` over its unix socket.
pub fn docker_info(host: &HostRoot, socket: &Path) -> DockerInfo {
    let real = host.path(socket);
    if !real.exists() {
        return DockerInfo::NoSocket(socket.to_path_buf());
    }
    let result = (|| -> std::io::Result<Vec<u8>> {
        let mut stream = UnixStream::connect(&real)?;
        stream.set_read_timeout(Some(Duration::from_secs(10)))?;
        stream.set_write_timeout(Some(Duration::from_secs(10)))?;
        stream.write_all(b"GET /info HTTP/1.0\r\nHost: docker\r\n\r\n")?;
        let mut answer = Vec::new();
        stream.take(16 << 20).read_to_end(&mut answer)?;
        Ok(answer)
    })();
    let answer = match result {
        Ok(answer) => answer,
        Err(error) => {
            return DockerInfo::ConnectFailed {
                socket: socket.to_path_buf(),
                error,
            }
        }
    };
    let text = String::from_utf8_lossy(&answer);
    let Some((head, body)) = text.split_once("\r\n\r\n") else {
        return DockerInfo::BadAnswer {
            socket: socket.to_path_buf(),
            detail: "no HTTP header in the answer".into(),
        };
    };
    let status = head.lines().next().unwrap_or_default().to_string();
    if !status.contains(" 200 ") && !status.ends_with(" 200") {
        return DockerInfo::BadAnswer {
            socket: socket.to_path_buf(),
            detail: status,
        };
    }
    match serde_json::from_str(body.trim()) {
        Ok(info) => DockerInfo::Info {
            socket: socket.to_path_buf(),
            info,
        },
        Err(error) => DockerInfo::BadAnswer {
            socket: socket.to_path_buf(),
            detail: format!("body is not JSON: {error}"),
        },
    }
}

/// The runtime checks in report order: Docker answers, GPUs can reach containers, the quick
/// GPU container. When Docker cannot be asked, that one finding is the whole layer.
pub fn check(host: &HostRoot, driver: &DriverReport, options: &DoctorOptions) -> Vec<Finding> {
    let (reachable, info) = match docker_reachable(host) {
        Ok(answer) => answer,
        Err(unreachable) => return vec![unreachable],
    };
    let gpu_access = GpuAccess::of(host, &info);
    vec![
        reachable,
        gpu_access.finding(driver),
        gpu_container_finding(host, options),
    ]
}

/// `docker.reachable` with the engine's `/info`, or the finding that says why Docker could
/// not be asked.
pub(crate) fn docker_reachable(host: &HostRoot) -> Result<(Finding, serde_json::Value), Finding> {
    let Some(socket) = docker_socket(host) else {
        return Err(Finding::new(
            "docker.remote",
            Severity::Warning,
            format!(
                "DOCKER_HOST={} is not a unix socket; the daemon's GPU setup cannot be checked from here",
                host.env("DOCKER_HOST").unwrap_or_default()
            ),
        )
        .fix("run `cudastack doctor` on the Docker host itself"));
    };
    match docker_info(host, &socket) {
        DockerInfo::NoSocket(socket) => Err(
            Finding::new("docker.unreachable", Severity::Error, "Docker is not reachable: no daemon socket")
                .evidence(format!("{}: absent", socket.display()))
                .fix("install Docker (or another OCI engine) and start it: `sudo systemctl enable --now docker` (images can still be built as OCI layouts without it)"),
        ),
        DockerInfo::ConnectFailed { socket, error } => Err(connect_failed_finding(&socket, &error)),
        DockerInfo::BadAnswer { socket, detail } => Err(
            Finding::new(
                "docker.bad_answer",
                Severity::Error,
                "the Docker socket answered, but not like a Docker Engine",
            )
            .evidence(format!("GET /info on {}: {detail}", socket.display()))
            .fix("check what listens on the socket (`docker version`)"),
        ),
        DockerInfo::Info { socket, info } => {
            let finding = Finding::new(
                "docker.reachable",
                Severity::Ok,
                format!(
                    "Docker Engine {} reachable",
                    info.get("ServerVersion")
                        .and_then(|v| v.as_str())
                        .unwrap_or("?")
                ),
            )
            .evidence(format!("GET /info on {}", socket.display()));
            Ok((finding, info))
        }
    }
}

fn connect_failed_finding(socket: &Path, error: &std::io::Error) -> Finding {
    let (summary, fix) = match error.kind() {
        std::io::ErrorKind::PermissionDenied => (
            "Docker is running but this user may not use its socket",
            "add the user to the docker group (`sudo usermod -aG docker $USER`, then log in again) or use rootless Docker",
        ),
        _ => (
            "Docker is not reachable: the socket exists but no daemon answers",
            "start the daemon: `sudo systemctl start docker` (the socket file may be stale)",
        ),
    };
    Finding::new("docker.unreachable", Severity::Error, summary)
        .evidence(format!("connect {}: {error}", socket.display()))
        .fix(fix)
}

/// The three ways GPUs reach containers: a registered nvidia runtime, the `--gpus` hook,
/// CDI specs naming `nvidia.com/gpu`.
struct GpuAccess {
    runtimes: Vec<String>,
    default_runtime: String,
    hook: Option<PathBuf>,
    cdi_specs: Vec<PathBuf>,
}

impl GpuAccess {
    fn of(host: &HostRoot, info: &serde_json::Value) -> Self {
        let runtimes: Vec<String> = info
            .get("Runtimes")
            .and_then(|r| r.as_object())
            .map(|r| r.keys().cloned().collect())
            .unwrap_or_default();
        let default_runtime = info
            .get("DefaultRuntime")
            .and_then(|v| v.as_str())
            .unwrap_or("runc")
            .to_string();
        let hook = host.which("nvidia-container-runtime-hook").or_else(|| {
            [
                "/usr/bin/nvidia-container-runtime-hook",
                "/usr/local/bin/nvidia-container-runtime-hook",
            ]
            .iter()
            .map(PathBuf::from)
            .find(|p| host.path(p).is_file())
        });
        let cdi_specs: Vec<PathBuf> = ["/etc/cdi", "/var/run/cdi"]
            .iter()
            .flat_map(|dir| {
                list_dir(host, Path::new(dir), |n| {
                    let n = n.to_string_lossy();
                    n.ends_with(".yaml") || n.ends_with(".json")
                })
            })
            .filter(|spec| {
                host.read_text(spec)
                    .is_some_and(|text| text.contains("nvidia.com/gpu"))
            })
            .collect();
        GpuAccess {
            runtimes,
            default_runtime,
            hook,
            cdi_specs,
        }
    }

    fn evidence(&self) -> Vec<String> {
        let mut evidence = vec![format!(
            "runtimes: {} (default {})",
            if self.runtimes.is_empty() {
                "none listed".to_string()
            } else {
                self.runtimes.join(", ")
            },
            self.default_runtime
        )];
        evidence.push(match &self.hook {
            Some(hook) => format!("--gpus hook: {}", hook.display()),
            None => "--gpus hook: nvidia-container-runtime-hook not found".into(),
        });
        evidence.push(if self.cdi_specs.is_empty() {
            "CDI: no nvidia.com/gpu spec in /etc/cdi or /var/run/cdi".into()
        } else {
            format!(
                "CDI: {}",
                self.cdi_specs
                    .iter()
                    .map(|p| p.display().to_string())
                    .collect::<Vec<_>>()
                    .join(", ")
            )
        });
        evidence
    }

    /// `docker.nvidia_runtime` naming the first way that works, or `docker.no_nvidia_runtime`
    /// (an error only where the host has GPUs to give).
    fn finding(&self, driver: &DriverReport) -> Finding {
        let nvidia_runtime = self.runtimes.iter().any(|r| r.starts_with("nvidia"));
        if nvidia_runtime || self.hook.is_some() || !self.cdi_specs.is_empty() {
            let how = if nvidia_runtime {
                "the nvidia runtime is registered with Docker"
            } else if self.hook.is_some() {
                "`docker run --gpus` can use the NVIDIA container toolkit's hook"
            } else {
                "CDI specs for nvidia.com/gpu exist (`docker run --device nvidia.com/gpu=all`, Docker >= 25)"
            };
            return Finding::new(
                "docker.nvidia_runtime",
                Severity::Ok,
                format!("GPUs can reach containers: {how}"),
            )
            .evidences(self.evidence());
        }
        let severity = if driver.gpus.is_empty() {
            Severity::Warning
        } else {
            Severity::Error
        };
        Finding::new(
            "docker.no_nvidia_runtime",
            severity,
            "Docker has no way to give containers a GPU: no nvidia runtime, no --gpus hook, no CDI spec",
        )
        .evidences(self.evidence())
        .fix("install nvidia-container-toolkit, then `sudo nvidia-ctk runtime configure --runtime=docker && sudo systemctl restart docker`")
    }
}

fn gpu_container_finding(host: &HostRoot, options: &DoctorOptions) -> Finding {
    match &options.gpu_image {
        Some(image) => gpu_container(host, image),
        None => Finding::new(
            "docker.gpu_container",
            Severity::Info,
            "quick GPU container not attempted (nothing is pulled): pass --gpu-image IMAGE with a local image that has nvidia-smi, or run `cudastack verify`",
        ),
    }
}

/// `docker run --rm --gpus all IMAGE nvidia-smi -L`.
fn gpu_container(host: &HostRoot, image: &str) -> Finding {
    let Some(docker) = host.which("docker") else {
        return Finding::new(
            "docker.gpu_container",
            Severity::Warning,
            "the docker CLI is not on PATH; GPU container not attempted",
        )
        .fix("install the docker CLI");
    };
    let outcome = host.run(
        &docker,
        &[
            "run",
            "--rm",
            "--pull=never",
            "--gpus",
            "all",
            image,
            "nvidia-smi",
            "-L",
        ],
        Duration::from_secs(120),
    );
    match outcome.success_stdout() {
        Some(stdout) if stdout.contains("GPU ") => Finding::new(
            "docker.gpu_container",
            Severity::Ok,
            format!("a GPU container started from {image} and saw the GPUs"),
        )
        .evidences(stdout.lines().map(str::to_string)),
        _ => Finding::new(
            "docker.gpu_container",
            Severity::Error,
            format!("a GPU container from {image} did not see a GPU"),
        )
        .evidence(outcome.describe())
        .fix("run `cudastack explain` on the output above"),
    }
}
