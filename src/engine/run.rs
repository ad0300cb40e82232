//! Running a command in a container: create, start, wait (with a timeout), collect the
//! output and exit code, copy a result file out, and always remove the container.
//!
//! The verify stage runs its probe through [`Engine::run`]. A non-zero exit is a normal
//! [`RunOutcome`], not an error (bollard reports it as an error value: CRATES.md pitfall
//! 3). GPUs are requested with `HostConfig.DeviceRequests` (driver `nvidia`,
//! capabilities `[["gpu"]]`) and/or the `nvidia` runtime; a daemon without the NVIDIA
//! Container Toolkit refuses them (500 at start, 400 at create), which becomes
//! [`EngineError::GpuUnavailable`] with what to install.
//!
//! Every container is labelled `io.cudastack.run=<pid>` and removed on every path: after
//! a normal exit, on timeout (killed first), on any error, on Ctrl-C, and (best effort, by
//! a spawned task) when the caller drops the future. Listening for Ctrl-C replaces the
//! process's default SIGINT action for the rest of its life (a tokio property), so the
//! run returns [`EngineError::Interrupted`] and the caller exits.

use std::collections::HashMap;
use std::io::Read;
use std::path::PathBuf;
use std::time::{Duration, Instant};

use bollard::container::LogOutput;
use bollard::errors::Error as BollardError;
use bollard::models::{ContainerCreateBody, DeviceRequest, HostConfig};
use bollard::query_parameters::{
    DownloadFromContainerOptions, KillContainerOptions, LogsOptions, RemoveContainerOptions,
};
use bollard::Docker;
use futures_util::StreamExt;

use super::{message_of, status_of, Engine, EngineError};

/// The label every container started by cudastack carries; its value is the pid.
pub const RUN_LABEL: &str = "io.cudastack.run";

/// Which GPUs the container gets.
#[derive(Debug, Clone, Default, PartialEq, Eq, serde::Serialize)]
pub enum GpuRequest {
    /// No GPU request.
    #[default]
    None,
    /// Every GPU (`--gpus all`, count -1).
    All,
    /// This many GPUs.
    Count(u32),
    /// These GPUs, by index or UUID.
    DeviceIds(Vec<String>),
}

impl GpuRequest {
    fn device_request(&self) -> Option<DeviceRequest> {
        let (count, device_ids) = match self {
            GpuRequest::None => return None,
            GpuRequest::All => (Some(-1), None),
            GpuRequest::Count(n) => (Some(i64::from(*n)), None),
            GpuRequest::DeviceIds(ids) => (None, Some(ids.clone())),
        };
        Some(DeviceRequest {
            driver: Some("nvidia".to_string()),
            count,
            device_ids,
            capabilities: Some(vec![vec!["gpu".to_string()]]),
            options: None,
        })
    }
}

/// What to run.
#[derive(Debug, Clone)]
pub struct RunSpec {
    /// Image reference or ID (`sha256:...`) the daemon has.
    pub image: String,
    /// The command (arguments to the entrypoint, if the image or `entrypoint` sets one).
    pub cmd: Vec<String>,
    /// Replace the image's entrypoint (`Some(vec![])` clears it).
    pub entrypoint: Option<Vec<String>>,
    pub env: Vec<(String, String)>,
    pub gpus: GpuRequest,
    /// Use the `nvidia` runtime. Also chosen automatically when `gpus` is not `None`
    /// and the daemon has that runtime registered.
    pub use_nvidia_runtime: bool,
    /// The container is killed and removed when it runs longer.
    pub timeout: Duration,
    /// A file (container path) to copy out after the command exits.
    pub copy_out: Option<String>,
    /// Bind mounts: host path, container path, read-only.
    pub binds: Vec<(PathBuf, String, bool)>,
    /// Extra labels (the run label is always added).
    pub labels: Vec<(String, String)>,
}

impl RunSpec {
    /// Run `cmd` in `image`: no GPU, a 10 minute timeout, nothing copied out.
    pub fn new(image: impl Into<String>, cmd: Vec<String>) -> Self {
        Self {
            image: image.into(),
            cmd,
            entrypoint: None,
            env: Vec::new(),
            gpus: GpuRequest::None,
            use_nvidia_runtime: false,
            timeout: Duration::from_secs(600),
            copy_out: None,
            binds: Vec::new(),
            labels: Vec::new(),
        }
    }
}

/// What happened in the container.
#[derive(Debug, Clone, serde::Serialize)]
pub struct RunOutcome {
    /// The command's exit status (137 after a timeout kill).
    pub exit_code: i64,
    pub stdout: String,
    pub stderr: String,
    /// The content of `copy_out`, when asked for and the command was not timed out.
    pub copied: Option<Vec<u8>>,
    /// True when the timeout killed the container.
    pub timed_out: bool,
    /// Wall time from create to removal.
    pub seconds: f64,
}

impl RunOutcome {
    pub fn success(&self) -> bool {
        self.exit_code == 0 && !self.timed_out
    }
}

/// Removes the container if the run future is dropped before it did so itself.
struct ContainerGuard {
    docker: Docker,
    id: Option<String>,
}

impl Drop for ContainerGuard {
    fn drop(&mut self) {
        if let (Some(id), Ok(handle)) = (self.id.take(), tokio::runtime::Handle::try_current()) {
            let docker = self.docker.clone();
            handle.spawn(async move {
                let _ = remove_container(&docker, &id).await;
            });
        }
    }
}

impl Engine {
    /// Run `spec` to completion (or its timeout) and remove the container.
    pub async fn run(&self, spec: &RunSpec) -> Result<RunOutcome, EngineError> {
        let started = Instant::now();
        let nvidia_runtime = spec.use_nvidia_runtime
            || (spec.gpus != GpuRequest::None && self.info().await?.nvidia_runtime);
        let mut labels: HashMap<String, String> = spec.labels.iter().cloned().collect();
        labels.insert(RUN_LABEL.to_string(), std::process::id().to_string());
        let host_config = HostConfig {
            binds: (!spec.binds.is_empty()).then(|| {
                spec.binds
                    .iter()
                    .map(|(host, container, read_only)| {
                        let mode = if *read_only { ":ro" } else { "" };
                        format!("{}:{container}{mode}", host.display())
                    })
                    .collect()
            }),
            device_requests: spec.gpus.device_request().map(|r| vec![r]),
            runtime: nvidia_runtime.then(|| "nvidia".to_string()),
            ..Default::default()
        };
        let body = ContainerCreateBody {
            image: Some(spec.image.clone()),
            cmd: Some(spec.cmd.clone()),
            entrypoint: spec.entrypoint.clone(),
            env: Some(spec.env.iter().map(|(k, v)| format!("{k}={v}")).collect()),
            labels: Some(labels),
            tty: Some(false),
            attach_stdout: Some(false),
            host_config: Some(host_config),
            ..Default::default()
        };
        let created = self
            .docker
            .create_container(None, body)
            .await
            .map_err(|source| self.classify(spec, "create", source))?;
        let id = created.id;
        let mut guard = ContainerGuard {
            docker: self.docker.clone(),
            id: Some(id.clone()),
        };
        let result = tokio::select! {
            result = self.drive(&id, spec) => result,
            () = ctrl_c() => Err(EngineError::Interrupted),
        };
        let removed = remove_container(&self.docker, &id).await;
        guard.id = None;
        let mut outcome = result?;
        removed.map_err(|source| EngineError::Container {
            image: spec.image.clone(),
            what: format!("removing container {id}"),
            source,
        })?;
        outcome.seconds = started.elapsed().as_secs_f64();
        Ok(outcome)
    }

    /// Start, wait (or kill at the timeout), collect logs, copy the result out.
    async fn drive(&self, id: &str, spec: &RunSpec) -> Result<RunOutcome, EngineError> {
        self.docker
            .start_container(id, None)
            .await
            .map_err(|source| self.classify(spec, "start", source))?;
        // The wait request lasts as long as the command: give it its own client timeout.
        let waiter = self.with_timeout(spec.timeout + Duration::from_secs(60));
        let container_error = |what: &str| {
            let what = what.to_string();
            let image = spec.image.clone();
            move |source| EngineError::Container {
                image,
                what,
                source,
            }
        };
        let (exit_code, timed_out) =
            match tokio::time::timeout(spec.timeout, wait_exit(&waiter, id)).await {
                Ok(code) => (code.map_err(container_error("waiting"))?, false),
                Err(_) => {
                    let options = KillContainerOptions {
                        signal: "SIGKILL".to_string(),
                    };
                    match self.docker.kill_container(id, Some(options)).await {
                        // 409: it exited between the timeout and the kill.
                        Ok(()) => {}
                        Err(error) if status_of(&error) == Some(409) => {}
                        Err(source) => return Err(container_error("killing")(source)),
                    }
                    let code = wait_exit(&self.docker, id)
                        .await
                        .map_err(container_error("waiting after kill"))?;
                    (code, true)
                }
            };

        let mut stdout = Vec::new();
        let mut stderr = Vec::new();
        let options = LogsOptions {
            stdout: true,
            stderr: true,
            follow: false,
            tail: "all".to_string(),
            ..Default::default()
        };
        let mut logs = self.docker.logs(id, Some(options));
        while let Some(item) = logs.next().await {
            match item.map_err(container_error("reading logs"))? {
                LogOutput::StdOut { message } | LogOutput::Console { message } => {
                    stdout.extend_from_slice(&message)
                }
                LogOutput::StdErr { message } => stderr.extend_from_slice(&message),
                LogOutput::StdIn { .. } => {}
            }
        }

        let copied = match (&spec.copy_out, timed_out) {
            (Some(path), false) => Some(self.copy_out(id, path).await?),
            _ => None,
        };
        Ok(RunOutcome {
            exit_code,
            stdout: String::from_utf8_lossy(&stdout).into_owned(),
            stderr: String::from_utf8_lossy(&stderr).into_owned(),
            copied,
            timed_out,
            seconds: 0.0,
        })
    }

    /// The content of the file `path` in container `id` (from the tar the API returns).
    /// Buffered: meant for result files (a JSON report), not for images.
    async fn copy_out(&self, id: &str, path: &str) -> Result<Vec<u8>, EngineError> {
        let failed = |problem: String| EngineError::CopyOut {
            path: path.to_string(),
            problem,
        };
        let options = DownloadFromContainerOptions {
            path: path.to_string(),
        };
        let mut archive = Vec::new();
        let mut stream = self.docker.download_from_container(id, Some(options));
        while let Some(chunk) = stream.next().await {
            match chunk {
                Ok(bytes) => archive.extend_from_slice(&bytes),
                Err(error) if status_of(&error) == Some(404) => {
                    return Err(failed("no such file in the container".to_string()))
                }
                Err(error) => return Err(failed(message_of(&error))),
            }
        }
        let mut tar = tar::Archive::new(archive.as_slice());
        let entries = tar.entries().map_err(|e| failed(e.to_string()))?;
        for entry in entries {
            let mut entry = entry.map_err(|e| failed(e.to_string()))?;
            let kind = entry.header().entry_type();
            if kind.is_file() {
                let mut content = Vec::new();
                entry
                    .read_to_end(&mut content)
                    .map_err(|e| failed(e.to_string()))?;
                return Ok(content);
            }
            if kind.is_dir() {
                return Err(failed("it is a directory, not a file".to_string()));
            }
            if kind.is_symlink() {
                return Err(failed("it is a symbolic link, not a file".to_string()));
            }
        }
        Err(failed("the daemon returned no file".to_string()))
    }

    /// A daemon error at create/start: GPU refusals and missing images get clear errors.
    fn classify(&self, spec: &RunSpec, step: &str, source: BollardError) -> EngineError {
        let message = message_of(&source);
        let lower = message.to_lowercase();
        let gpu_asked = spec.gpus != GpuRequest::None || spec.use_nvidia_runtime;
        if gpu_asked
            && (lower.contains("device driver")
                || lower.contains("nvidia")
                || lower.contains("runtime name")
                || lower.contains("gpu"))
        {
            return EngineError::GpuUnavailable {
                detail: message.trim().to_string(),
            };
        }
        if step == "create" && status_of(&source) == Some(404) && lower.contains("image") {
            return EngineError::NoSuchImage {
                image: spec.image.clone(),
            };
        }
        EngineError::Container {
            image: spec.image.clone(),
            what: format!("{step} failed"),
            source,
        }
    }
}

/// Resolves on Ctrl-C; never, when the runtime cannot listen for signals.
async fn ctrl_c() {
    if tokio::signal::ctrl_c().await.is_err() {
        std::future::pending::<()>().await;
    }
}

/// Wait for the container to stop; its exit code (bollard returns non-zero as an error).
async fn wait_exit(docker: &Docker, id: &str) -> Result<i64, BollardError> {
    let mut stream = Box::pin(docker.wait_container(id, None));
    match stream.next().await {
        Some(Ok(response)) => Ok(response.status_code),
        Some(Err(BollardError::DockerContainerWaitError { code, .. })) => Ok(code),
        Some(Err(error)) => Err(error),
        None => Err(BollardError::DockerStreamError {
            error: format!("the wait for container {id} ended without a status"),
        }),
    }
}

/// Force-remove a container and its anonymous volumes; an absent one is fine.
async fn remove_container(docker: &Docker, id: &str) -> Result<(), BollardError> {
    let options = RemoveContainerOptions {
        force: true,
        v: true,
        ..Default::default()
    };
    match docker.remove_container(id, Some(options)).await {
        Ok(()) => Ok(()),
        Err(error) if status_of(&error) == Some(404) => Ok(()),
        // 409: removal already in progress (e.g. a concurrent cleanup).
        Err(error) if status_of(&error) == Some(409) => Ok(()),
        Err(error) => Err(error),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn gpu_requests_become_device_requests() {
        assert!(GpuRequest::None.device_request().is_none());
        let all = GpuRequest::All.device_request().unwrap();
        assert_eq!(all.count, Some(-1));
        assert_eq!(all.driver.as_deref(), Some("nvidia"));
        assert_eq!(all.capabilities, Some(vec![vec!["gpu".to_string()]]));
        assert_eq!(
            GpuRequest::Count(2).device_request().unwrap().count,
            Some(2)
        );
        let ids = GpuRequest::DeviceIds(vec!["0".into(), "GPU-abc".into()])
            .device_request()
            .unwrap();
        assert_eq!(ids.count, None);
        assert_eq!(ids.device_ids, Some(vec!["0".into(), "GPU-abc".into()]));
    }
}
