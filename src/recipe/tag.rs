//! Tag templates: the recipe's `tags:` (`{registry}/torch:{torch}-cuda{cuda_mm}`), expanded
//! in one pass and checked as image references where the recipe is parsed.
//!
//! A tag becomes a Docker tag (`cudastack load`), an OCI layout ref and a registry reference,
//! so it must follow the distribution reference grammar: `[host[:port]/]path[:tag]`, path
//! components `[a-z0-9]+(?:(?:[._]|__|[-]*)[a-z0-9]+)*`, tag `[\w][\w.-]{0,127}`
//! (<https://github.com/distribution/reference/blob/main/reference.go>). It is checked by
//! [`Reference::parse_name`], the one grammar in the crate (the registry client and the
//! Docker Engine output use the same parser); nothing here adds to it.
//!
//! [`Recipe::parse`](super::Recipe::parse) renders every template with the values the recipe
//! itself fixes and stand-ins for what only the lock knows (the registry is `localhost`,
//! the default of `build --registry`); `build` renders them again with the real values and
//! the same checks, so a bad `--registry` fails before anything is written.

use std::fmt;

use crate::reference::{Reference, ReferenceProblem};

/// Template placeholders a tag may use.
pub const TAG_PLACEHOLDERS: &[&str] = &[
    "registry",
    "name",
    "torch",
    "cuda",
    "cuda_mm",
    "cudnn",
    "cudnn_major",
    "python",
];

/// What each placeholder stands for in one rendering.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TagValues {
    pub registry: String,
    pub name: String,
    pub torch: String,
    pub cuda: String,
    pub cuda_mm: String,
    pub cudnn: String,
    pub cudnn_major: String,
    pub python: String,
}

impl TagValues {
    fn get(&self, key: &str) -> Option<&str> {
        Some(match key {
            "registry" => &self.registry,
            "name" => &self.name,
            "torch" => &self.torch,
            "cuda" => &self.cuda,
            "cuda_mm" => &self.cuda_mm,
            "cudnn" => &self.cudnn,
            "cudnn_major" => &self.cudnn_major,
            "python" => &self.python,
            _ => return None,
        })
    }
}

/// Why a tag template cannot be used. Every variant names the template as written.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum TagError {
    #[error("tag template `{}` has an unclosed `{{`", escape(.template))]
    Unclosed { template: String },
    #[error(
        "tag template `{}` uses unknown placeholder `{{{}}}`; known: {}",
        escape(.template),
        escape(.key),
        TAG_PLACEHOLDERS.join(", ")
    )]
    UnknownPlaceholder { template: String, key: String },
    #[error("tag `{}` {}is not a valid image reference: {problem}", escape(.template), Becomes(.template, .rendered))]
    Reference {
        template: String,
        rendered: String,
        problem: TagProblem,
    },
}

/// What is wrong with a rendered tag: the reference grammar's own answer.
pub type TagProblem = ReferenceProblem;

impl TagError {
    /// What to do about it.
    pub fn hint(&self) -> String {
        match self {
            TagError::Unclosed { .. } => "close the placeholder with `}`".into(),
            TagError::UnknownPlaceholder { .. } => format!(
                "use one of {}",
                TAG_PLACEHOLDERS
                    .iter()
                    .map(|key| format!("{{{key}}}"))
                    .collect::<Vec<_>>()
                    .join(" ")
            ),
            TagError::Reference { problem, template, .. } => match problem {
                TagProblem::Empty => "remove the empty tag, or write one such as `{registry}/{name}:latest`".into(),
                TagProblem::Repository { .. } => "write the image name in lowercase letters and digits, with `.`, `_`, `__` or `-` between them and `/` between path parts (no `..`, no spaces)".into(),
                TagProblem::Tag { .. } if template.contains("{torch}") => "a torch build from a PyTorch index has a local version (`2.1.2+cu118`) and `+` cannot be in a tag: spell the version out instead of `{torch}`, or keep to [A-Za-z0-9_.-] after the `:`".into(),
                TagProblem::Tag { .. } => "keep the part after the last `:` to letters, digits, `_`, `.` and `-`, at most 128 characters".into(),
                TagProblem::Registry { .. } => "give the registry as `host[:port]` (`ghcr.io`, `127.0.0.1:5000`), or use `{registry}` and `cudastack build --registry HOST`".into(),
                TagProblem::Digest | TagProblem::BadDigest { .. } => "remove the `@...` part; `cudastack build` prints the digest".into(),
                TagProblem::Ipv6ForDocker { .. } => problem.hint().into(),
            },
        }
    }
}

/// ` (as `...`) ` when the rendered text differs from the template.
struct Becomes<'a>(&'a str, &'a str);

impl fmt::Display for Becomes<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.0 != self.1 {
            write!(f, "(rendered `{}`) ", escape(self.1))?;
        }
        Ok(())
    }
}

pub(crate) use crate::reference::escape;

/// The placeholders of `template`, in order; an error for an unclosed or unknown one.
pub fn check_template(template: &str) -> Result<(), TagError> {
    expand(template, |_| Some("")).map(drop)
}

/// `template` with every placeholder replaced by its value, in one pass (a value that
/// contains `{name}` stays as it is).
fn expand<'v>(template: &str, value: impl Fn(&str) -> Option<&'v str>) -> Result<String, TagError> {
    let mut out = String::with_capacity(template.len());
    let mut rest = template;
    while let Some(open) = rest.find('{') {
        out.push_str(&rest[..open]);
        let Some(close) = rest[open..].find('}') else {
            return Err(TagError::Unclosed {
                template: template.to_string(),
            });
        };
        let key = &rest[open + 1..open + close];
        let Some(text) = value(key).filter(|_| TAG_PLACEHOLDERS.contains(&key)) else {
            return Err(TagError::UnknownPlaceholder {
                template: template.to_string(),
                key: key.to_string(),
            });
        };
        out.push_str(text);
        rest = &rest[open + close + 1..];
    }
    out.push_str(rest);
    Ok(out)
}

/// Render `template` with `values` and check the result is an image reference a tag can be.
pub fn render(template: &str, values: &TagValues) -> Result<String, TagError> {
    let rendered = expand(template, |key| values.get(key))?;
    check_reference(&rendered).map_err(|problem| TagError::Reference {
        template: template.to_string(),
        rendered: rendered.clone(),
        problem,
    })?;
    Ok(rendered)
}

/// The reference grammar's checks of a name to give an image (see the module docs).
fn check_reference(text: &str) -> Result<(), TagProblem> {
    Reference::parse_name(text)
        .map(drop)
        .map_err(|error| error.problem)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn values() -> TagValues {
        TagValues {
            registry: "localhost".into(),
            name: "torch2.4.1-cu121-py3.11".into(),
            torch: "2.4.1".into(),
            cuda: "12.1".into(),
            cuda_mm: "12.1".into(),
            cudnn: "9.1.0.70".into(),
            cudnn_major: "9".into(),
            python: "3.11".into(),
        }
    }

    #[test]
    fn renders_in_one_pass() {
        let tag = render(
            "{registry}/torch:{torch}-cuda{cuda_mm}-cudnn{cudnn_major}-py{python}",
            &values(),
        )
        .unwrap();
        assert_eq!(tag, "localhost/torch:2.4.1-cuda12.1-cudnn9-py3.11");
        // A value holding a placeholder is not expanded again.
        let mut odd = values();
        odd.registry = "{name}".into();
        assert!(expand("{registry}", |k| odd.get(k)).unwrap() == "{name}");
    }

    #[test]
    fn a_newline_in_a_name_is_said_as_one() {
        // "has uppercase letters" was the answer to `torch\nX`.
        let error = render("{registry}/torch\nX:1", &values()).unwrap_err();
        let message = error.to_string();
        assert!(
            message.contains("holds `\\n`, a control character"),
            "{message}"
        );
        assert!(!message.contains("uppercase"), "{message}");
        assert_eq!(message.lines().count(), 1, "{message}");
    }

    #[test]
    fn the_grammar_is_enforced_after_rendering() {
        let bad = |template: &str| render(template, &values()).unwrap_err();
        assert!(matches!(
            bad("{registry}/torch:a\nb"),
            TagError::Reference {
                problem: TagProblem::Tag { .. },
                ..
            }
        ));
        assert!(matches!(
            bad("{registry}/Torch:1"),
            TagError::Reference {
                problem: TagProblem::Repository { .. },
                ..
            }
        ));
        assert!(matches!(
            bad(""),
            TagError::Reference {
                problem: TagProblem::Empty,
                ..
            }
        ));
        assert!(matches!(
            bad("../torch:1"),
            TagError::Reference {
                problem: TagProblem::Registry { .. },
                ..
            }
        ));
        assert!(matches!(
            bad("{registry}/../torch:1"),
            TagError::Reference {
                problem: TagProblem::Repository { .. },
                ..
            }
        ));
        assert!(matches!(
            bad("a..b:5000/torch:1"),
            TagError::Reference {
                problem: TagProblem::Registry { .. },
                ..
            }
        ));
        assert!(matches!(
            bad("-a.io/torch:1"),
            TagError::Reference {
                problem: TagProblem::Registry { .. },
                ..
            }
        ));
        assert!(matches!(bad("{registry}/torch:1@sha256:0000000000000000000000000000000000000000000000000000000000000000"), TagError::Reference { problem: TagProblem::Digest, .. }));
        let mut variant = values();
        variant.torch = "2.1.2+cu118".into();
        let error = render("{registry}/torch:{torch}", &variant).unwrap_err();
        assert!(error.hint().contains("`+`"), "{}", error.hint());
        assert!(
            error
                .to_string()
                .contains("rendered `localhost/torch:2.1.2+cu118`"),
            "{error}"
        );
        // A newline is shown escaped, so the message stays on one line.
        assert!(!bad("{registry}/torch:a\nb").to_string().contains('\n'));
    }

    #[test]
    fn valid_forms() {
        for template in [
            "{registry}/torch:{torch}",
            "localhost:5000/a/b_c__d---e:_x",
            "127.0.0.1:5000/torch",
            "[::1]:5000/torch:1",
            "ghcr.io/org/{name}:py{python}",
            "torch",
            "Registry.Example.COM/torch:Latest",
        ] {
            render(template, &values()).unwrap_or_else(|e| panic!("{template}: {e}"));
        }
        for bad in ["[::1/torch", "host:/torch", "host:123456/torch"] {
            assert!(
                matches!(
                    render(bad, &values()),
                    Err(TagError::Reference {
                        problem: TagProblem::Registry { .. },
                        ..
                    })
                ),
                "{bad}"
            );
        }
    }

    #[test]
    fn placeholders_are_checked() {
        assert!(matches!(
            check_template("{registry/x"),
            Err(TagError::Unclosed { .. })
        ));
        assert!(
            matches!(check_template("{pyton}"), Err(TagError::UnknownPlaceholder { key, .. }) if key == "pyton")
        );
        check_template("{registry}/{name}:{cuda}").unwrap();
    }
}
