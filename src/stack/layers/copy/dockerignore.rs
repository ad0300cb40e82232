//! `.dockerignore` patterns, with Docker's meaning (moby/patternmatcher): each line a
//! pattern relative to the context root (a leading `/` and `./` are dropped, the path is
//! cleaned), `*` and `?` never cross `/`, `**` matches any number of directories, `!`
//! re-includes, `#` starts a comment. A pattern that matches a directory excludes all
//! below it; the last pattern that matches a path or one of its parents decides.
//! Matching is globset's (`literal_separator`); only the file syntax and the
//! parent rule are here.
//!
//! The file is the pull request's: it is read through [`ContainedFile`] (no link followed,
//! no FIFO or device, at most [`MAX_BYTES`]), so a link to a host file cannot show its
//! first line in a pattern error, nor a link to `/dev/zero` read until memory runs out
//! .

use std::path::Path;

use globset::{GlobBuilder, GlobMatcher};

use crate::contained_file::{ContainedError, ContainedFile};

/// The largest `.dockerignore` read: Docker's own files are a few hundred bytes.
const MAX_BYTES: u64 = 1 << 20;

/// An ordered list of exclude and `!` re-include patterns.
#[derive(Debug, Default)]
pub struct IgnorePatterns {
    patterns: Vec<Pattern>,
}

#[derive(Debug)]
struct Pattern {
    matcher: GlobMatcher,
    /// A `!pattern`: re-include what an earlier pattern excluded.
    include: bool,
}

impl IgnorePatterns {
    /// Patterns from lines (a `.dockerignore` file's, or a recipe's `exclude:` list).
    /// `origin` names where they come from in errors.
    pub fn parse<'a>(
        lines: impl IntoIterator<Item = &'a str>,
        origin: &str,
    ) -> Result<Self, String> {
        let mut patterns = Vec::new();
        for (number, line) in lines.into_iter().enumerate() {
            let line = line.trim();
            if line.is_empty() || line.starts_with('#') {
                continue;
            }
            let (include, text) = match line.strip_prefix('!') {
                Some(rest) => (true, rest.trim()),
                None => (false, line),
            };
            let cleaned = clean(text);
            if cleaned.is_empty() {
                continue;
            }
            let matcher = GlobBuilder::new(&cleaned)
                .literal_separator(true)
                .backslash_escape(true)
                .build()
                .map_err(|e| {
                    let line = crate::printable::short(line);
                    format!("{origin}:{}: pattern `{line}`: {e}", number + 1)
                })?
                .compile_matcher();
            patterns.push(Pattern { matcher, include });
        }
        Ok(Self { patterns })
    }

    /// The patterns of the `.dockerignore` in `dir`, or none when it has none.
    pub fn load(dir: &Path) -> Result<Self, String> {
        let path = dir.join(".dockerignore");
        let bytes = match ContainedFile::open(dir, Path::new(".dockerignore")) {
            Ok(file) => file.read_to_vec(MAX_BYTES),
            Err(ContainedError::Missing { .. }) => return Ok(Self::default()),
            Err(error) => Err(error),
        }
        .map_err(|error| error.to_string())?;
        let text = String::from_utf8(bytes).map_err(|_| {
            format!(
                "`{}` is not UTF-8 text\n  hint: a .dockerignore holds one pattern a line",
                crate::printable::path(&path)
            )
        })?;
        Self::parse(text.lines(), &path.display().to_string())
    }

    /// Whether `relative` (a `/`-separated path below the root these patterns are for) is
    /// excluded.
    pub fn excludes(&self, relative: &str) -> bool {
        let mut excluded = false;
        for pattern in &self.patterns {
            // Docker: a pattern matches the path or any directory above it.
            let matches = ancestors_and_self(relative).any(|path| pattern.matcher.is_match(path));
            if matches {
                excluded = !pattern.include;
            }
        }
        excluded
    }

    /// Whether some `!` pattern may re-include a path inside an excluded directory, so the
    /// walk must look inside it.
    pub fn has_exceptions(&self) -> bool {
        self.patterns.iter().any(|p| p.include)
    }
}

/// `a/b/c` -> `a`, `a/b`, `a/b/c`.
fn ancestors_and_self(relative: &str) -> impl Iterator<Item = &str> {
    relative
        .match_indices('/')
        .map(|(i, _)| &relative[..i])
        .chain(std::iter::once(relative))
}

/// Go's `filepath.Clean` of a pattern, without a leading `/` or `./` (Docker's context
/// root is the pattern root).
fn clean(text: &str) -> String {
    let mut parts: Vec<&str> = Vec::new();
    for part in text.split('/') {
        match part {
            "" | "." => {}
            ".." => {
                parts.pop();
            }
            part => parts.push(part),
        }
    }
    parts.join("/")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn patterns(lines: &[&str]) -> IgnorePatterns {
        IgnorePatterns::parse(lines.iter().copied(), "test").unwrap()
    }

    #[test]
    fn docker_semantics() {
        let p = patterns(&[
            "# comment",
            "*.md",
            "!README.md",
            "/data/",
            "**/__pycache__",
            "temp?",
        ]);
        assert!(p.excludes("CHANGES.md"));
        assert!(!p.excludes("README.md"));
        // `*` does not cross `/`: Docker's *.md is the root's only.
        assert!(!p.excludes("docs/guide.md"));
        assert!(p.excludes("data"));
        assert!(p.excludes("data/big/shard-0.bin"));
        assert!(p.excludes("__pycache__/a.pyc"));
        assert!(p.excludes("pkg/sub/__pycache__/a.pyc"));
        assert!(p.excludes("temp1"));
        assert!(!p.excludes("temp12"));
        assert!(!p.excludes("train.py"));
    }

    #[test]
    fn exceptions_inside_excluded_directories() {
        let p = patterns(&["data", "!data/README.md"]);
        assert!(p.has_exceptions());
        assert!(p.excludes("data/x.bin"));
        assert!(!p.excludes("data/README.md"));
    }

    #[test]
    fn a_bad_pattern_names_its_line() {
        let error = IgnorePatterns::parse(["ok", "[z-a"], ".dockerignore").unwrap_err();
        assert!(error.starts_with(".dockerignore:2:"), "{error}");
    }

    /// Run `load` on another thread: a `.dockerignore` that blocks or never ends fails the
    /// test after `seconds` instead of hanging the suite.
    fn load_within(dir: &Path, seconds: u64) -> Result<IgnorePatterns, String> {
        let dir = dir.to_path_buf();
        let (send, receive) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            let _ = send.send(IgnorePatterns::load(&dir));
        });
        receive
            .recv_timeout(std::time::Duration::from_secs(seconds))
            .expect("loading .dockerignore hung")
    }

    #[test]
    fn a_dockerignore_link_to_a_host_file_is_not_read() {
        // The first line of the host file came back in the pattern error.
        let context = tempfile::tempdir().unwrap();
        let host = tempfile::tempdir().unwrap();
        fs_err::write(host.path().join("shadow"), "[root-secret-z-a\n").unwrap();
        std::os::unix::fs::symlink(
            host.path().join("shadow"),
            context.path().join(".dockerignore"),
        )
        .unwrap();
        let error = load_within(context.path(), 10).unwrap_err();
        assert!(!error.contains("secret"), "{error}");
        assert!(error.contains("symbolic link"), "{error}");
    }

    #[test]
    fn a_dockerignore_link_to_dev_zero_is_not_read() {
        // It was read until memory ran out.
        let context = tempfile::tempdir().unwrap();
        std::os::unix::fs::symlink("/dev/zero", context.path().join(".dockerignore")).unwrap();
        let error = load_within(context.path(), 10).unwrap_err();
        assert!(error.contains("symbolic link"), "{error}");
    }

    #[test]
    fn a_dockerignore_fifo_neither_blocks_nor_is_read() {
        let context = tempfile::tempdir().unwrap();
        let fifo = std::ffi::CString::new(
            context
                .path()
                .join(".dockerignore")
                .into_os_string()
                .into_encoded_bytes(),
        )
        .unwrap();
        // SAFETY: a NUL-terminated path.
        assert_eq!(unsafe { libc::mkfifo(fifo.as_ptr(), 0o644) }, 0);
        let error = load_within(context.path(), 10).unwrap_err();
        assert!(error.contains("named pipe"), "{error}");
    }

    #[test]
    fn a_huge_dockerignore_is_refused() {
        let context = tempfile::tempdir().unwrap();
        let line = "a-pattern-that-is-long-enough/**/*.bin\n";
        let text = line.repeat((MAX_BYTES as usize / line.len()) + 1);
        fs_err::write(context.path().join(".dockerignore"), text).unwrap();
        let error = load_within(context.path(), 30).unwrap_err();
        assert!(error.contains("more than the"), "{error}");
    }
}
