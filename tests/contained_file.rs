//! Reading a file of a directory a pull request controls (issue 32), with the real
//! things: a symbolic link to a host file and to `/dev/zero`, a FIFO with no writer, a
//! file that grows. Each read ends, promptly, with an error that says what the file is.

use std::path::Path;
use std::time::Duration;

use cudastack::contained_file::{ContainedError, ContainedFile};

/// `open` and read on another thread: a read that blocks or never ends fails the test
/// after 10 s instead of hanging the suite.
fn read(root: &Path, relative: &str) -> Result<Vec<u8>, ContainedError> {
    let (root, relative) = (root.to_path_buf(), relative.to_string());
    let (send, receive) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let result =
            ContainedFile::open(&root, Path::new(&relative)).and_then(|f| f.read_to_vec(1 << 20));
        let _ = send.send(result);
    });
    receive
        .recv_timeout(Duration::from_secs(10))
        .expect("the read hung")
}

fn mkfifo(path: &Path) {
    let path = std::ffi::CString::new(path.as_os_str().as_encoded_bytes()).unwrap();
    // SAFETY: a NUL-terminated path.
    assert_eq!(unsafe { libc::mkfifo(path.as_ptr(), 0o644) }, 0);
}

#[test]
fn a_link_to_a_host_file_is_not_followed() {
    let root = tempfile::tempdir().unwrap();
    let host = tempfile::tempdir().unwrap();
    std::fs::write(host.path().join("shadow"), "root:$6$secret\n").unwrap();
    std::os::unix::fs::symlink(
        host.path().join("shadow"),
        root.path().join("requirements.txt"),
    )
    .unwrap();
    let error = read(root.path(), "requirements.txt").unwrap_err();
    assert!(matches!(error, ContainedError::Link { .. }), "{error}");
    assert!(!error.to_string().contains("secret"), "{error}");
    // A link to a directory on the way is not followed either.
    std::os::unix::fs::symlink(host.path(), root.path().join("conf")).unwrap();
    let error = read(root.path(), "conf/shadow").unwrap_err();
    assert!(error.to_string().contains("a symbolic link"), "{error}");
}

#[test]
fn a_link_to_dev_zero_is_not_read() {
    let root = tempfile::tempdir().unwrap();
    std::os::unix::fs::symlink("/dev/zero", root.path().join("zero")).unwrap();
    let error = read(root.path(), "zero").unwrap_err();
    assert!(matches!(error, ContainedError::Link { .. }), "{error}");
}

#[test]
fn a_fifo_is_refused_without_blocking() {
    let root = tempfile::tempdir().unwrap();
    mkfifo(&root.path().join("pipe"));
    let error = read(root.path(), "pipe").unwrap_err();
    assert!(
        error
            .to_string()
            .contains("is a named pipe (FIFO), not a regular file"),
        "{error}"
    );
}

#[test]
fn a_device_is_refused() {
    // /dev itself as the root: `zero` there is the device, not a link to it.
    let error = read(Path::new("/dev"), "zero").unwrap_err();
    assert!(error.to_string().contains("is a device"), "{error}");
}

#[test]
fn a_long_name_is_cut_in_the_message() {
    let root = tempfile::tempdir().unwrap();
    let name = "n".repeat(100_000);
    let error = read(root.path(), &name).unwrap_err();
    let message = error.to_string();
    assert!(message.len() < 1000, "{} bytes", message.len());
    assert!(message.contains("…"), "{message}");
}
