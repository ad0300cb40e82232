//! `entry_points.txt` console and GUI scripts, and the launcher scripts written for them
//! (byte for byte the launcher pip/distlib writes on POSIX, so tools behave as users expect
//! and the install tests can compare against a real `pip install`).

/// One `console_scripts` / `gui_scripts` entry: `name = module:attr.sub [extras]`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ScriptEntry {
    pub name: String,
    pub module: String,
    /// The object path inside the module, e.g. `cli.main`.
    pub attribute: String,
}

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum EntryPointError {
    #[error("line {line}: `{text}` is not `name = module:attribute`")]
    Malformed { line: usize, text: String },
    #[error("line {line}: script name `{name}` is not a plain file name")]
    BadName { line: usize, name: String },
}

fn is_dotted_identifier(text: &str) -> bool {
    !text.is_empty()
        && text.split('.').all(|part| {
            let mut chars = part.chars();
            matches!(chars.next(), Some(c) if c == '_' || c.is_alphabetic())
                && chars.all(|c| c == '_' || c.is_alphanumeric())
        })
}

/// Parse the `[console_scripts]` and `[gui_scripts]` sections (both become launchers on
/// POSIX). Other sections are plugin registrations, not scripts, and are ignored.
pub fn parse_scripts(text: &str) -> Result<Vec<ScriptEntry>, EntryPointError> {
    let mut section = String::new();
    let mut scripts = Vec::new();
    for (index, raw) in text.lines().enumerate() {
        let line = index + 1;
        let trimmed = raw.trim();
        if trimmed.is_empty() || trimmed.starts_with('#') || trimmed.starts_with(';') {
            continue;
        }
        if let Some(name) = trimmed.strip_prefix('[').and_then(|s| s.strip_suffix(']')) {
            section = name.trim().to_string();
            continue;
        }
        if section != "console_scripts" && section != "gui_scripts" {
            continue;
        }
        let malformed = || EntryPointError::Malformed {
            line,
            text: trimmed.to_string(),
        };
        let (name, value) = trimmed.split_once('=').ok_or_else(malformed)?;
        let name = name.trim();
        // Extras (`[extra]`) only select optional dependencies; they do not change the launcher.
        let value = value.split('[').next().unwrap_or_default().trim();
        let (module, attribute) = value.split_once(':').ok_or_else(malformed)?;
        let (module, attribute) = (module.trim(), attribute.trim());
        if !is_dotted_identifier(module) || !is_dotted_identifier(attribute) {
            return Err(malformed());
        }
        // The name becomes a file in the scripts directory: one plain component (the same
        // check as every other outside name), and no whitespace.
        if crate::fetch::file_name::FileName::new(name).is_err()
            || name.chars().any(char::is_whitespace)
        {
            return Err(EntryPointError::BadName {
                line,
                name: name.to_string(),
            });
        }
        scripts.push(ScriptEntry {
            name: name.to_string(),
            module: module.to_string(),
            attribute: attribute.to_string(),
        });
    }
    Ok(scripts)
}

/// The launcher script for `entry`, run by `python` (an absolute interpreter path).
/// Its bytes depend only on the inputs.
pub fn launcher(entry: &ScriptEntry, python: &str) -> Vec<u8> {
    let import_name = entry
        .attribute
        .split('.')
        .next()
        .unwrap_or(&entry.attribute);
    format!(
        "#!{python}\n\
         # -*- coding: utf-8 -*-\n\
         import re\n\
         import sys\n\
         from {module} import {import_name}\n\
         if __name__ == '__main__':\n    \
             sys.argv[0] = re.sub(r'(-script\\.pyw|\\.exe)?$', '', sys.argv[0])\n    \
             sys.exit({attribute}())\n",
        module = entry.module,
        attribute = entry.attribute,
    )
    .into_bytes()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_console_and_gui_scripts_only() {
        let text = "[console_scripts]\ntorchrun = torch.distributed.run:main\nfoo=pkg.cli:app.run [extra]\n\n[gui_scripts]\nview = pkg.gui:main\n[torch.plugins]\nx = y:z\n";
        let scripts = parse_scripts(text).unwrap();
        assert_eq!(
            scripts.iter().map(|s| s.name.as_str()).collect::<Vec<_>>(),
            ["torchrun", "foo", "view"]
        );
        assert_eq!(scripts[1].attribute, "app.run");
        let body = String::from_utf8(launcher(&scripts[1], "/usr/bin/python3")).unwrap();
        assert!(body.starts_with("#!/usr/bin/python3\n"));
        assert!(body.contains("from pkg.cli import app\n"));
        assert!(body.contains("    sys.exit(app.run())\n"));
    }

    #[test]
    fn rejects_injection_and_bad_names() {
        assert!(matches!(
            parse_scripts("[console_scripts]\nx = os:system('rm')\n"),
            Err(EntryPointError::Malformed { line: 2, .. })
        ));
        assert!(matches!(
            parse_scripts("[console_scripts]\n../evil = a:b\n"),
            Err(EntryPointError::BadName { .. })
        ));
        assert!(matches!(
            parse_scripts("[console_scripts]\nnocolon = a.b\n"),
            Err(EntryPointError::Malformed { .. })
        ));
    }
}
