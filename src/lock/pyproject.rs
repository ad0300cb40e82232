//! `pyproject.toml` as an input: `[project].dependencies` (PEP 621), the extras
//! the recipe chooses from `[project.optional-dependencies]`, and the PEP 735
//! `[dependency-groups]` it chooses (with `{include-group = "..."}`). The project itself is
//! not installed: its dependencies are. An extra that names the project itself
//! (`all = ["proj[train,eval]"]`) is expanded, as pip does.

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;
use std::str::FromStr;

use pep508_rs::{ExtraName, PackageName, VersionOrUrl};
use serde::Deserialize;
use toml::Spanned;

use crate::lock::python_inputs::{
    invalid_requirement, join_relative, InputReader, Origin, PythonInputsError,
};
use crate::recipe::python_inputs::PyprojectInput;

#[derive(Deserialize)]
struct Pyproject {
    project: Option<Project>,
    #[serde(rename = "dependency-groups", default)]
    dependency_groups: BTreeMap<String, Vec<Spanned<GroupEntry>>>,
}

#[derive(Deserialize)]
struct Project {
    name: Option<String>,
    #[serde(default)]
    dependencies: Vec<Spanned<String>>,
    #[serde(rename = "optional-dependencies", default)]
    optional_dependencies: BTreeMap<String, Vec<Spanned<String>>>,
    #[serde(default)]
    dynamic: Vec<String>,
}

#[derive(Deserialize)]
#[serde(untagged)]
enum GroupEntry {
    Requirement(String),
    Include {
        #[serde(rename = "include-group")]
        include_group: String,
    },
}

/// The pyproject.toml being read: its text (for line numbers) and name.
struct Source<'a> {
    file: &'a str,
    text: &'a str,
}

impl Source<'_> {
    fn origin(&self, offset: usize, place: String) -> Origin {
        let line = 1 + self.text[..offset.min(self.text.len())]
            .matches('\n')
            .count();
        Origin {
            file: self.file.to_string(),
            line: Some(line),
            place: Some(place),
        }
    }

    fn error(&self, message: String, hint: String) -> PythonInputsError {
        PythonInputsError::Entry {
            origin: Origin {
                file: self.file.to_string(),
                line: None,
                place: None,
            },
            message,
            hint,
        }
    }
}

/// Read the dependencies `input` chooses from its pyproject.toml.
pub(crate) fn read(
    reader: &mut InputReader,
    input: &PyprojectInput,
) -> Result<(), PythonInputsError> {
    let file = join_relative(Path::new(""), input.path.as_path(), "pyproject:")?;
    let text = reader.read_text(&file, "pyproject:")?;
    let parsed: Pyproject = toml::from_str(&text).map_err(|source| PythonInputsError::Toml {
        path: file.clone().into(),
        source: Box::new(source),
    })?;
    let source = Source {
        file: &file,
        text: &text,
    };
    let project = parsed.project.as_ref();
    if project.is_none() && (!input.extras.is_empty() || parsed.dependency_groups.is_empty()) {
        return Err(source.error(
            "there is no `[project]` table (PEP 621), so no dependencies to read".into(),
            "declare `[project].dependencies`, or list the requirements in a requirements file"
                .into(),
        ));
    }
    if let Some(project) = project {
        if project
            .dynamic
            .iter()
            .any(|d| d == "dependencies" || d == "optional-dependencies")
        {
            return Err(source.error(
                "the project's dependencies are `dynamic`: its build backend computes them, and cudastack does not run a build to lock".into(),
                "list the dependencies in `[project]` itself, or in a requirements file the recipe names".into(),
            ));
        }
        let own = project
            .name
            .as_deref()
            .and_then(|n| PackageName::from_str(n).ok());
        let mut extras: Vec<ExtraName> = input.extras.iter().map(|e| e.0.clone()).collect();
        let mut done = BTreeSet::new();
        for dependency in &project.dependencies {
            let origin = source.origin(dependency.span().start, "[project].dependencies".into());
            add(
                reader,
                dependency.get_ref(),
                origin,
                own.as_ref(),
                &mut extras,
            )?;
        }
        while let Some(extra) = extras.pop() {
            if !done.insert(extra.clone()) {
                continue;
            }
            let Some((key, list)) = project
                .optional_dependencies
                .iter()
                .find(|(key, _)| ExtraName::from_str(key).is_ok_and(|k| k == extra))
            else {
                let known: Vec<&String> = project.optional_dependencies.keys().collect();
                return Err(source.error(
                    format!("the recipe asks for the extra `{extra}`, which `[project.optional-dependencies]` does not define"),
                    format!("choose from {known:?}"),
                ));
            };
            let place = format!("[project.optional-dependencies] {key}");
            for dependency in list {
                let origin = source.origin(dependency.span().start, place.clone());
                add(
                    reader,
                    dependency.get_ref(),
                    origin,
                    own.as_ref(),
                    &mut extras,
                )?;
            }
        }
    }
    let groups = resolve_groups(&source, &parsed.dependency_groups, input)?;
    for (place, entry) in groups {
        let origin = source.origin(entry.0, place);
        add(reader, entry.1, origin, None, &mut Vec::new())?;
    }
    Ok(())
}

/// Add one dependency, or queue the extras of a dependency on the project itself.
fn add(
    reader: &mut InputReader,
    text: &str,
    origin: Origin,
    own: Option<&PackageName>,
    extras: &mut Vec<ExtraName>,
) -> Result<(), PythonInputsError> {
    let requirement =
        crate::names::parse_requirement(text).map_err(|error| PythonInputsError::Entry {
            origin: origin.clone(),
            message: invalid_requirement(text, &error),
            hint: "write `name`, `name==1.2.3` or `name>=1.2; python_version >= \"3.10\"`".into(),
        })?;
    let url = matches!(requirement.version_or_url, Some(VersionOrUrl::Url(_)));
    // The URL parser expands `${VAR}`: a lock must not depend on the environment.
    if url && text.contains("${") {
        return Err(PythonInputsError::Entry {
            origin,
            message: format!(
                "`{}` uses an environment variable (`${{...}}`), which a lock must not depend on",
                requirement.name
            ),
            hint: "write the URL out".into(),
        });
    }
    if url && !crate::lock::python_inputs::is_git_requirement(&requirement, &origin)? {
        return Err(PythonInputsError::Entry {
            origin,
            message: format!("`{}` names a URL, not a package on an index: cudastack locks packages it can list on an index and pin by sha256", crate::recipe::masked_urls(text)),
            hint: "publish the package to an index named in the recipe's `indexes:` and require it by name".into(),
        });
    }
    if Some(&requirement.name) == own {
        if requirement.evaluate_markers(&reader.env, &[]) {
            extras.extend(requirement.extras.iter().cloned());
        }
        return Ok(());
    }
    reader.add_root(requirement, origin)
}

/// A dependency-group requirement: (place, (byte offset, requirement text)).
type GroupEntryAt<'p> = (String, (usize, &'p str));

/// The entries of the chosen dependency groups, includes followed (PEP 735), as
/// (place, (offset, requirement text)).
fn resolve_groups<'p>(
    source: &Source<'_>,
    table: &'p BTreeMap<String, Vec<Spanned<GroupEntry>>>,
    input: &PyprojectInput,
) -> Result<Vec<GroupEntryAt<'p>>, PythonInputsError> {
    let find = |name: &ExtraName| {
        table
            .iter()
            .find(|(key, _)| ExtraName::from_str(key).is_ok_and(|k| &k == name))
    };
    let mut out = Vec::new();
    let mut pending: Vec<(ExtraName, Vec<ExtraName>)> = input
        .groups
        .iter()
        .rev()
        .map(|g| (g.0.clone(), Vec::new()))
        .collect();
    let mut done = BTreeSet::new();
    while let Some((group, chain)) = pending.pop() {
        if chain.contains(&group) {
            return Err(source.error(
                format!("the dependency group `{group}` includes itself (through {chain:?})"),
                "remove one `include-group` of the cycle (PEP 735 forbids cycles)".into(),
            ));
        }
        if !done.insert(group.clone()) {
            continue;
        }
        let Some((key, entries)) = find(&group) else {
            let known: Vec<&String> = table.keys().collect();
            return Err(source.error(
                format!("the recipe asks for the dependency group `{group}`, which `[dependency-groups]` does not define"),
                format!("choose from {known:?}"),
            ));
        };
        let mut chain = chain;
        chain.push(group.clone());
        for entry in entries {
            match entry.get_ref() {
                GroupEntry::Requirement(text) => out.push((
                    format!("[dependency-groups] {key}"),
                    (entry.span().start, text.as_str()),
                )),
                GroupEntry::Include { include_group } => {
                    let included = ExtraName::from_str(include_group).map_err(|e| {
                        source.error(
                            format!(
                                "`include-group = \"{include_group}\"` is not a group name: {e}"
                            ),
                            "name a group of `[dependency-groups]`".into(),
                        )
                    })?;
                    pending.push((included, chain.clone()));
                }
            }
        }
    }
    Ok(out)
}
