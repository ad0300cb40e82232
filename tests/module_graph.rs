//! The module map holds (issue 17): src/lib.rs lists the modules in groups that follow the
//! data flow, and no module imports a module of a group below its own, and no two modules
//! import each other, directly or through others. Imports are read from the source as every
//! `crate::<module>` path outside comments and `#[cfg(test)]` code, so a new upward or
//! circular import fails here with the file that makes it.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

fn src() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("src")
}

/// The groups of `pub mod` lines in src/lib.rs, each started by a `// ` comment line.
fn groups() -> Vec<Vec<String>> {
    let lib = std::fs::read_to_string(src().join("lib.rs")).unwrap();
    let mut groups: Vec<Vec<String>> = Vec::new();
    for line in lib.lines() {
        if line.starts_with("// ") {
            groups.push(Vec::new());
        } else if let Some(name) = line.strip_prefix("pub mod ") {
            let name = name.trim_end_matches(';').to_string();
            groups
                .last_mut()
                .expect("a `// group` comment before the first `pub mod`")
                .push(name);
        }
    }
    groups
}

fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) {
    for entry in std::fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        if path.is_dir() {
            rust_files(&path, out);
        } else if path.extension().is_some_and(|e| e == "rs") {
            out.push(path);
        }
    }
}

/// `module -> imported module -> files that import it`, for every module under src/.
fn imports() -> BTreeMap<String, BTreeMap<String, BTreeSet<String>>> {
    let mut files = Vec::new();
    rust_files(&src(), &mut files);
    let mut graph: BTreeMap<String, BTreeMap<String, BTreeSet<String>>> = BTreeMap::new();
    for file in files {
        let relative = file.strip_prefix(src()).unwrap();
        let module = relative
            .components()
            .next()
            .unwrap()
            .as_os_str()
            .to_string_lossy()
            .trim_end_matches(".rs")
            .to_string();
        if module == "lib" || module == "main" || module == "cli" {
            continue;
        }
        let text = std::fs::read_to_string(&file).unwrap();
        // Test code may reach anywhere: it is not part of the map.
        let code = text.split("#[cfg(test)]").next().unwrap_or_default();
        for line in code.lines() {
            let line = line.trim_start();
            if line.starts_with("//") {
                continue;
            }
            for (at, _) in line.match_indices("crate::") {
                let rest = &line[at + "crate::".len()..];
                let name: String = rest
                    .chars()
                    .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
                    .collect();
                if !name.is_empty() && name != module {
                    graph
                        .entry(module.clone())
                        .or_default()
                        .entry(name)
                        .or_default()
                        .insert(relative.display().to_string());
                }
            }
        }
    }
    graph
}

#[test]
fn every_module_is_in_a_group_of_lib_rs() {
    let listed: BTreeSet<String> = groups().into_iter().flatten().collect();
    let mut on_disk = BTreeSet::new();
    for entry in std::fs::read_dir(src()).unwrap() {
        let name = entry.unwrap().file_name().to_string_lossy().to_string();
        let name = name.trim_end_matches(".rs").to_string();
        if !["lib", "main", "cli"].contains(&name.as_str()) {
            on_disk.insert(name);
        }
    }
    assert_eq!(
        listed, on_disk,
        "src/lib.rs lists a different set of modules"
    );
}

#[test]
fn no_module_imports_a_module_of_a_group_below_its_own() {
    let group_of: BTreeMap<String, usize> = groups()
        .into_iter()
        .enumerate()
        .flat_map(|(index, group)| group.into_iter().map(move |m| (m, index)))
        .collect();
    let mut upward = Vec::new();
    for (module, imported) in imports() {
        for (target, files) in imported {
            let (Some(from), Some(to)) = (group_of.get(&module), group_of.get(&target)) else {
                continue; // a crate::name that is not a module (a macro, a re-export)
            };
            if to > from {
                upward.push(format!("{module} -> {target} ({files:?})"));
            }
        }
    }
    assert!(
        upward.is_empty(),
        "imports up the flow:\n{}",
        upward.join("\n")
    );
}

#[test]
fn no_two_modules_import_each_other() {
    let graph = imports();
    let reaches = |from: &str, to: &str| {
        let mut seen = BTreeSet::new();
        let mut stack = vec![from.to_string()];
        while let Some(module) = stack.pop() {
            for next in graph.get(&module).into_iter().flat_map(|m| m.keys()) {
                if next == to {
                    return true;
                }
                if seen.insert(next.clone()) {
                    stack.push(next.clone());
                }
            }
        }
        false
    };
    let mut cycles = Vec::new();
    for (module, imported) in &graph {
        for (target, files) in imported {
            if reaches(target, module) {
                cycles.push(format!("{module} -> {target} ({files:?})"));
            }
        }
    }
    assert!(cycles.is_empty(), "module cycles:\n{}", cycles.join("\n"));
}
