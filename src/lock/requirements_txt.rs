//! requirements.txt, as pip reads it: `\` continuations, `#` comments, `-r`/`-c` includes
//! relative to the including file, per-requirement `--hash=sha256:...`, PEP 508 markers.
//!
//! A small parser over pep508_rs rather than a crate: uv's `uv-requirements-txt` is
//! published as "an internal component crate of uv" (0.0.x, no stable API) and its current
//! releases need Rust 1.97, above this crate's 1.89. What pip takes but cudastack does not
//! (indexes in the file, editables, URL and path requirements, source builds) is an error
//! that names file:line and says what to do instead, never silently dropped.

use std::collections::BTreeSet;
use std::path::Path;

use pep508_rs::{Requirement, VersionOrUrl};

use crate::digest::Digest;
use crate::lock::python_inputs::{
    invalid_requirement, is_git_requirement, join_relative, name_token, InputReader, Origin,
    PythonInputsError, PUBLISH_OR_COPY,
};

/// Read `relative` (a path the recipe's `requirements:` names) and every file it includes.
pub(crate) fn read(reader: &mut InputReader, relative: &Path) -> Result<(), PythonInputsError> {
    let display = join_relative(Path::new(""), relative, "requirements:")?;
    let mut walk = Walk {
        reader,
        stack: Vec::new(),
        done: BTreeSet::new(),
    };
    walk.file(&display, false, None)
}

/// One walk over a file and its includes.
struct Walk<'a> {
    reader: &'a mut InputReader,
    /// The files being read, outermost first (an include cycle is an error).
    stack: Vec<String>,
    /// (file, as constraints) already read: a file included twice is read once.
    done: BTreeSet<(String, bool)>,
}

/// What one logical line of the file is.
#[derive(Debug, PartialEq)]
enum Line<'t> {
    Include {
        path: &'t str,
        constraint: bool,
    },
    /// An option cudastack accepts and has nothing to do for (`--only-binary :all:`).
    Ignored,
    Requirement {
        text: &'t str,
        hashes: Vec<&'t str>,
    },
    /// A local project's directory (`./libs/teamlib`, `-e .`): built from source
    /// (src/lock/sdist.rs), never linked.
    Project {
        path: &'t str,
    },
}

impl Walk<'_> {
    fn file(
        &mut self,
        display: &str,
        constraint: bool,
        included_from: Option<&Origin>,
    ) -> Result<(), PythonInputsError> {
        if self.stack.iter().any(|f| f == display) {
            let chain = [self.stack.as_slice(), &[display.to_string()]].concat();
            return Err(entry(
                included_from
                    .cloned()
                    .unwrap_or_else(|| Origin::line(display, 1)),
                format!("the includes form a cycle: {}", chain.join(" -> ")),
                "remove one of the `-r`/`-c` lines of the cycle".into(),
            ));
        }
        if !self.done.insert((display.to_string(), constraint)) {
            return Ok(());
        }
        let key = match included_from {
            Some(origin) => format!("included from {origin}"),
            None => "requirements:".to_string(),
        };
        let text = self.reader.read_text(display, &key)?;
        self.stack.push(display.to_string());
        for (number, line) in logical_lines(&text) {
            let origin = Origin::line(display, number);
            match parse_line(&line, &origin)? {
                Line::Include {
                    path,
                    constraint: as_constraint,
                } => {
                    let base = Path::new(display).parent().unwrap_or(Path::new(""));
                    let target =
                        join_relative(base, Path::new(path), &format!("included from {origin}"))?;
                    self.file(&target, constraint || as_constraint, Some(&origin))?;
                }
                Line::Ignored => {}
                Line::Requirement { text, hashes } => {
                    self.requirement(text, &hashes, constraint, origin)?
                }
                Line::Project { path } => {
                    if constraint {
                        return Err(entry(
                            origin,
                            format!("the constraint file names a project directory (`{}`); a constraint only narrows versions", crate::reference::escape(path)),
                            "move the line to a requirements file".into(),
                        ));
                    }
                    let base = Path::new(display).parent().unwrap_or(Path::new(""));
                    let key = format!("the project at {origin}");
                    let target = join_relative(base, Path::new(path), &key)?;
                    self.reader.add_project(&target, origin)?;
                }
            }
        }
        self.stack.pop();
        Ok(())
    }

    fn requirement(
        &mut self,
        text: &str,
        hashes: &[&str],
        constraint: bool,
        origin: Origin,
    ) -> Result<(), PythonInputsError> {
        let requirement = parse_requirement(text, &origin)?;
        if constraint && matches!(requirement.version_or_url, Some(VersionOrUrl::Url(_))) {
            return Err(entry(
                origin,
                format!(
                    "the constraint `{}` names a URL; a constraint only narrows versions",
                    requirement.name
                ),
                "move the line to a requirements file".into(),
            ));
        }
        if constraint && !requirement.extras.is_empty() {
            return Err(entry(
                origin,
                format!("the constraint `{text}` has extras; a constraint only narrows versions"),
                format!(
                    "write `{}` without the extras (pip refuses extras in constraints too)",
                    requirement.name
                ),
            ));
        }
        if !requirement.evaluate_markers(&self.reader.env, &[]) {
            return Ok(());
        }
        let sha256 = hashes
            .iter()
            .map(|h| parse_hash(h, &origin))
            .collect::<Result<BTreeSet<Digest>, _>>()?;
        if !sha256.is_empty() {
            self.reader
                .add_hashes(requirement.name.clone(), origin.clone(), sha256);
        }
        if constraint {
            self.reader.add_constraint(requirement, origin)
        } else {
            self.reader.add_root(requirement, origin)
        }
    }
}

fn entry(origin: Origin, message: String, hint: String) -> PythonInputsError {
    PythonInputsError::Entry {
        origin,
        message,
        hint,
    }
}

/// The file's logical lines with the number of their first physical line: `\` joins a line
/// to the next, comments (`#` at the start or after whitespace) and blank lines go, as pip's
/// `req_file.preprocess` does.
fn logical_lines(text: &str) -> Vec<(usize, String)> {
    let mut out = Vec::new();
    let mut pending: Option<(usize, String)> = None;
    for (index, raw) in text.lines().enumerate() {
        let number = index + 1;
        let comment = is_comment(raw);
        match (raw.strip_suffix('\\'), comment) {
            (Some(head), false) => {
                let (_, joined) = pending.get_or_insert_with(|| (number, String::new()));
                joined.push_str(head);
            }
            _ => {
                let (first, mut joined) = pending.take().unwrap_or((number, String::new()));
                joined.push_str(raw);
                let kept = strip_comment(&joined).trim().to_string();
                if !kept.is_empty() {
                    out.push((first, kept));
                }
            }
        }
    }
    if let Some((first, joined)) = pending {
        let kept = strip_comment(&joined).trim().to_string();
        if !kept.is_empty() {
            out.push((first, kept));
        }
    }
    out
}

fn is_comment(line: &str) -> bool {
    line.trim_start().starts_with('#')
}

/// `line` up to a `#` that starts it or follows whitespace.
fn strip_comment(line: &str) -> &str {
    let bytes = line.as_bytes();
    for (i, &b) in bytes.iter().enumerate() {
        if b == b'#' && (i == 0 || bytes[i - 1].is_ascii_whitespace()) {
            return &line[..i];
        }
    }
    line
}

/// The option name and its value (`--requirement=x`, `--requirement x`, `-rx`, `-r x`).
fn split_option(line: &str) -> (&str, Option<&str>) {
    if let Some(long) = line.strip_prefix("--") {
        let end = long
            .find(|c: char| c == '=' || c.is_whitespace())
            .unwrap_or(long.len());
        let value = long[end..].trim_start_matches('=').trim();
        return (&line[..end + 2], (!value.is_empty()).then_some(value));
    }
    // `-` and the next character, which need not be ASCII (`-é`).
    let end = line.char_indices().nth(2).map_or(line.len(), |(i, _)| i);
    let name = &line[..end];
    let value = line[name.len()..].trim();
    (name, (!value.is_empty()).then_some(value))
}

fn parse_line<'t>(line: &'t str, origin: &Origin) -> Result<Line<'t>, PythonInputsError> {
    if line.contains("${") {
        return Err(entry(origin.clone(), "the line uses an environment variable (`${...}`), which pip expands and cudastack does not: a lock must not depend on the environment it was made in".into(), "write the value into the file".into()));
    }
    if is_directory_line(line) {
        return Ok(Line::Project { path: line.trim() });
    }
    if !line.starts_with('-') {
        return requirement_line(line, origin);
    }
    let (name, value) = split_option(line);
    let needs_value = |value: Option<&'t str>| {
        value.ok_or_else(|| {
            entry(
                origin.clone(),
                format!("`{name}` needs a file name"),
                format!("write `{name} FILE`"),
            )
        })
    };
    match name {
        "-r" | "--requirement" => Ok(Line::Include {
            path: needs_value(value)?,
            constraint: false,
        }),
        "-c" | "--constraint" => Ok(Line::Include {
            path: needs_value(value)?,
            constraint: true,
        }),
        "-i" | "--index-url" | "--extra-index-url" | "--no-index" | "-f" | "--find-links"
        | "--trusted-host" => Err(entry(
            origin.clone(),
            format!("`{name}` is not read from requirements files: where packages come from is the recipe's business, and the lock records it"),
            "use the recipe's `indexes:` (docs/recipe-python.md), and delete this line".into(),
        )),
        // An image holds no link to this machine's tree: the project is built into a
        // wheel, as `./dir` is.
        "-e" | "--editable" => match value.filter(|v| is_directory_line(v)) {
            Some(path) => Ok(Line::Project { path }),
            None => Err(entry(
                origin.clone(),
                "an editable requirement of a URL or a name links the environment to a source tree cudastack does not lock".into(),
                "name the project's directory (`-e ./libs/teamlib`, built into a wheel from the recipe's directory), require it from git (`name @ git+https://...@TAG`), or see docs/recipe-python.md".into(),
            )),
        },
        "--no-binary" => Err(entry(
            origin.clone(),
            "`--no-binary` asks for source builds; cudastack installs wheels only (source builds are separate work)".into(),
            "delete this line; every package is installed from a wheel".into(),
        )),
        "--pre" => Err(entry(
            origin.clone(),
            "`--pre` lets every requirement take a pre-release; cudastack takes a pre-release only where a requirement asks for one".into(),
            "pin the pre-release you want (`name==2.0rc1`) and delete this line".into(),
        )),
        "--only-binary" | "--prefer-binary" | "--require-hashes" => Ok(Line::Ignored),
        _ => Err(entry(
            origin.clone(),
            format!("`{name}` is not an option cudastack takes in a requirements file"),
            "the file may hold requirements, `-r`/`-c` includes, `--hash`, and `--only-binary`, `--prefer-binary`, `--require-hashes` (which change nothing: cudastack installs wheels locked by hash)".into(),
        )),
    }
}

/// A requirement line: the requirement, then its options (only `--hash`).
fn requirement_line<'t>(line: &'t str, origin: &Origin) -> Result<Line<'t>, PythonInputsError> {
    // pip's split: the requirement ends where the first option (` -...`) begins.
    let start = line
        .match_indices(" -")
        .chain(line.match_indices("\t-"))
        .map(|(i, _)| i)
        .min()
        .unwrap_or(line.len());
    let text = line[..start].trim();
    let mut hashes = Vec::new();
    let mut rest = line[start..].split_whitespace();
    while let Some(token) = rest.next() {
        let value = match token.strip_prefix("--hash") {
            Some("") => rest.next(),
            Some(with) => with.strip_prefix('='),
            None => None,
        };
        match value {
            Some(value) => hashes.push(value),
            None => {
                // The option's name only: its value may be anything.
                let option = token.split('=').next().unwrap_or(token);
                return Err(entry(
                    origin.clone(),
                    format!("`{option}` is not an option cudastack takes after a requirement"),
                    "a requirement may carry `--hash=sha256:...` options only".into(),
                ));
            }
        }
    }
    Ok(Line::Requirement { text, hashes })
}

/// Whether a line (or `-e`'s value) names a project directory relative to the file: `.`,
/// `./dir`, `../dir` (pip's forms; an absolute path or an archive is not one).
fn is_directory_line(text: &str) -> bool {
    let text = text.trim();
    let relative = text == "." || text == ".." || text.starts_with("./") || text.starts_with("../");
    let archive = [".whl", ".tar.gz", ".zip", ".tar.bz2", ".tgz"]
        .iter()
        .any(|ext| text.ends_with(ext));
    relative && !archive && !text.contains(char::is_whitespace) && !text.contains(';')
}

/// What a requirement file's text might name besides a package on an index.
fn looks_like_path(text: &str) -> bool {
    let first = text
        .split(|c: char| c.is_whitespace() || c == ';')
        .next()
        .unwrap_or("");
    first.starts_with('.')
        || first.starts_with('/')
        || first.contains("://")
        || first.contains('/')
        || [".whl", ".tar.gz", ".zip", ".tar.bz2"]
            .iter()
            .any(|ext| first.ends_with(ext))
}

fn parse_requirement(text: &str, origin: &Origin) -> Result<Requirement, PythonInputsError> {
    // Only the name is quoted: the line may be a URL with a token in it.
    let url_refused = || {
        let what = match name_token(text) {
            "" => "the requirement".to_string(),
            name => format!("the requirement `{name}`"),
        };
        entry(
            origin.clone(),
            format!("{what} names a URL or a path, not a package on an index: cudastack locks packages it can list on an index or in the recipe's `wheels:` and pin by sha256"),
            PUBLISH_OR_COPY.into(),
        )
    };
    if looks_like_path(text) && !text.contains(" @ ") && !text.contains('@') {
        return Err(url_refused());
    }
    let requirement = crate::names::parse_requirement(text).map_err(|error| {
        entry(
            origin.clone(),
            invalid_requirement(text, &error),
            "write `name`, `name==1.2.3` or `name>=1.2; python_version >= \"3.10\"`".into(),
        )
    })?;
    if let Some(VersionOrUrl::Url(_)) = &requirement.version_or_url {
        if !is_git_requirement(&requirement, origin)? {
            return Err(url_refused());
        }
    }
    Ok(requirement)
}

fn parse_hash(text: &str, origin: &Origin) -> Result<Digest, PythonInputsError> {
    match text.split_once(':') {
        Some(("sha256", hex)) => Digest::from_hex(hex).map_err(|_| {
            entry(
                origin.clone(),
                format!("`--hash={text}` is not a sha256: it needs 64 hex digits"),
                "copy the hash again from the index or `pip hash`".into(),
            )
        }),
        Some((algorithm, _)) => Err(entry(
            origin.clone(),
            format!("`--hash={text}` is {algorithm}; cudastack checks sha256, the hash every index publishes"),
            "use `--hash=sha256:...` (`pip hash FILE` prints it)".into(),
        )),
        None => Err(entry(
            origin.clone(),
            format!("`--hash={text}` has no algorithm"),
            "write `--hash=sha256:HEX`".into(),
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn origin() -> Origin {
        Origin::line("requirements.txt", 3)
    }

    #[test]
    fn logical_lines_join_continuations_and_drop_comments() {
        let text = "# top\nsix==1.16.0 \\\n    --hash=sha256:aa # why\n\nidna  # pinned elsewhere\nurl#frag\n#tail \\\nlast\\";
        assert_eq!(
            logical_lines(text),
            vec![
                (2, "six==1.16.0     --hash=sha256:aa".to_string()),
                (5, "idna".to_string()),
                (6, "url#frag".to_string()),
                (8, "last".to_string()),
            ]
        );
    }

    #[test]
    fn lines_parse_into_includes_and_requirements() {
        let o = origin();
        assert_eq!(
            parse_line("-r base.txt", &o).unwrap(),
            Line::Include {
                path: "base.txt",
                constraint: false
            }
        );
        assert_eq!(
            parse_line("--constraint=c.txt", &o).unwrap(),
            Line::Include {
                path: "c.txt",
                constraint: true
            }
        );
        assert_eq!(
            parse_line("-cc.txt", &o).unwrap(),
            Line::Include {
                path: "c.txt",
                constraint: true
            }
        );
        assert_eq!(
            parse_line("--only-binary :all:", &o).unwrap(),
            Line::Ignored
        );
        assert_eq!(
            parse_line(
                "six==1.16.0 ; python_version >= '3' --hash=sha256:ab --hash sha256:cd",
                &o
            )
            .unwrap(),
            Line::Requirement {
                text: "six==1.16.0 ; python_version >= '3'",
                hashes: vec!["sha256:ab", "sha256:cd"]
            }
        );
    }

    /// `-é` sliced a two-byte character in half and panicked.
    #[test]
    fn non_ascii_lines_are_errors_not_panics() {
        let o = origin();
        for line in [
            "-é",
            "-éé x",
            "-€",
            "-😀",
            "--é",
            "--é=x",
            "-r😀",
            "é",
            "名前==1.0",
            "six==1.0 --é",
            "six==1.0 -😀",
            "six ; python_version >= 'é' and",
            "-\u{301}",
            "six --hash=sha256:é",
            "-c",
        ] {
            let error = parse_line(line, &o)
                .and_then(|parsed| match parsed {
                    Line::Requirement { text, hashes } => {
                        parse_requirement(text, &o)?;
                        hashes.iter().try_for_each(|h| parse_hash(h, &o).map(drop))
                    }
                    _ => Ok(()),
                })
                .map(|()| String::new())
                .unwrap_or_else(|e| e.to_string());
            if line == "-r😀" {
                assert!(error.is_empty(), "{line}: an include of `😀`: {error}");
                continue;
            }
            assert!(error.starts_with("requirements.txt:3: "), "{line}: {error}");
        }
        assert_eq!(split_option("-é"), ("-é", None));
        assert_eq!(split_option("-rébase.txt"), ("-r", Some("ébase.txt")));
        assert_eq!(
            logical_lines("-é \\\n  x\n# é\n"),
            vec![(1, "-é   x".to_string())]
        );
    }

    #[test]
    fn refused_lines_name_the_line_and_what_to_do() {
        let o = origin();
        for (line, expected, hint) in [
            (
                "--index-url https://example.org/simple",
                "`--index-url` is not read",
                "the recipe's `indexes:`",
            ),
            (
                "--extra-index-url=https://example.org/simple",
                "`--extra-index-url` is not read",
                "`indexes:`",
            ),
            (
                "-e https://example.org/x",
                "editable",
                "`-e ./libs/teamlib`",
            ),
            ("-e pkg", "editable", "git+https"),
            ("--no-binary :all:", "wheels only", "delete this line"),
            ("--pre", "pre-release", "pin the pre-release"),
            (
                "--use-feature=fast-deps",
                "not an option cudastack takes",
                "`--hash`",
            ),
            ("-r", "needs a file name", "-r FILE"),
            (
                "six --global-option=x",
                "not an option cudastack takes after a requirement",
                "--hash",
            ),
            ("numpy==${NUMPY}", "environment variable", "write the value"),
        ] {
            let error = parse_line(line, &o).unwrap_err().to_string();
            assert!(error.starts_with("requirements.txt:3: "), "{line}: {error}");
            assert!(error.contains(expected), "{line}: {error}");
            assert!(error.contains(hint), "{line}: {error}");
        }
        for line in [
            ".",
            "./libs/teamlib",
            "-e .",
            "-e ../teamlib",
            "--editable=./x",
        ] {
            let path = line.rsplit([' ', '=']).next().unwrap();
            assert_eq!(
                parse_line(line, &o).unwrap(),
                Line::Project { path },
                "{line}"
            );
        }
        for (text, expected) in [
            ("/abs/project", "names a URL or a path"),
            ("dist/pkg-1.0-py3-none-any.whl", "names a URL or a path"),
            (
                "https://example.org/pkg-1.0.tar.gz",
                "names a URL or a path",
            ),
            (
                "pkg @ https://example.org/pkg-1.0-py3-none-any.whl",
                "names a URL or a path",
            ),
            ("six===", "not a valid PEP 508 requirement"),
        ] {
            let error = parse_requirement(text, &o).unwrap_err().to_string();
            assert!(error.starts_with("requirements.txt:3: "), "{text}: {error}");
            assert!(error.contains(expected), "{text}: {error}");
            if expected.contains("a path") {
                // A wheel file there goes in `wheels:`, required by its name.
                assert!(
                    error.contains("hint: put its wheel in a directory named in the recipe's `wheels:` and require it by name"),
                    "{text}: {error}"
                );
            }
        }
        for (hash, expected) in [
            ("sha512:abcd", "is sha512"),
            ("sha256:abcd", "64 hex digits"),
            ("abcd", "has no algorithm"),
        ] {
            let error = parse_hash(hash, &o).unwrap_err().to_string();
            assert!(error.contains(expected), "{hash}: {error}");
        }
    }
}
