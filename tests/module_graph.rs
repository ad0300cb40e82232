//! The module map holds (issue 17): src/lib.rs lists the modules in groups that follow the
//! data flow, and no module imports a module of a group below its own, and no two modules
//! import each other, directly or through others; docs/architecture.md says, per module,
//! what it depends on, and says it right.
//!
//! Imports are read by parsing every file of the library's module tree as Rust (syn): a
//! module imports `<name>` when its code names `crate::<name>` in a `use` tree (groups and
//! nested groups included), a path in an expression, type or pattern, a macro's or an
//! attribute's tokens (`#[error("...", crate::printable::path(.path))]`), or a `"crate::..."`
//! string of an attribute (`#[serde(with = ...)]`); doc comments do not count. Code under `#[cfg(test)]`
//! is left out item by item, wherever it stands in a file: test code may reach anywhere.
//! `super::` paths that leave a top-level module are not followed.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

use proc_macro2::{TokenStream, TokenTree};
use syn::visit::{self, Visit};

fn root() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR"))
}

fn src() -> PathBuf {
    root().join("src")
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

fn modules() -> BTreeSet<String> {
    groups().into_iter().flatten().collect()
}

/// Whether `attrs` hold `#[cfg(test)]` or `#[cfg(all(test, ...))]`: code built for tests only.
fn is_test_only(attrs: &[syn::Attribute]) -> bool {
    attrs.iter().any(|attr| {
        if !attr.path().is_ident("cfg") {
            return false;
        }
        match attr.parse_args::<syn::Meta>() {
            Ok(syn::Meta::Path(path)) => path.is_ident("test"),
            Ok(syn::Meta::List(list)) if list.path.is_ident("all") => list
                .parse_args_with(
                    syn::punctuated::Punctuated::<syn::Meta, syn::Token![,]>::parse_terminated,
                )
                .is_ok_and(|all| all.iter().any(|meta| meta.path().is_ident("test"))),
            _ => false,
        }
    })
}

/// The `<name>` of every `crate::<name>` in the code it visits, test-only items left out.
#[derive(Default)]
struct CratePaths {
    names: BTreeSet<String>,
}

impl CratePaths {
    /// A `use` tree: `at_root` until the tree has passed its first segment, `after_crate`
    /// right after a leading `crate`, where the next name is the module.
    fn use_tree(&mut self, tree: &syn::UseTree, at_root: bool, after_crate: bool) {
        match tree {
            syn::UseTree::Path(path) if after_crate => {
                self.names.insert(path.ident.to_string());
            }
            syn::UseTree::Path(path) if at_root && path.ident == "crate" => {
                self.use_tree(&path.tree, false, true);
            }
            syn::UseTree::Name(name) if after_crate => {
                self.names.insert(name.ident.to_string());
            }
            syn::UseTree::Rename(rename) if after_crate => {
                self.names.insert(rename.ident.to_string());
            }
            syn::UseTree::Group(group) => {
                for tree in &group.items {
                    self.use_tree(tree, at_root, after_crate);
                }
            }
            _ => {}
        }
    }

    /// `crate :: name` in a macro's tokens, at any depth of delimiters.
    fn tokens(&mut self, tokens: TokenStream) {
        let tokens: Vec<TokenTree> = tokens.into_iter().collect();
        for (at, token) in tokens.iter().enumerate() {
            match token {
                TokenTree::Group(group) => self.tokens(group.stream()),
                TokenTree::Ident(ident) if ident == "crate" => {
                    if let [TokenTree::Punct(first), TokenTree::Punct(second), TokenTree::Ident(name), ..] =
                        &tokens[at + 1..]
                    {
                        if first.as_char() == ':' && second.as_char() == ':' {
                            self.names.insert(name.to_string());
                        }
                    }
                }
                _ => {}
            }
        }
    }

    /// `"crate::name::..."` strings in an attribute's tokens (`#[serde(with = "...")]`).
    fn attribute_strings(&mut self, tokens: TokenStream) {
        for token in tokens {
            match token {
                TokenTree::Group(group) => self.attribute_strings(group.stream()),
                TokenTree::Literal(literal) => {
                    if let Ok(syn::Lit::Str(text)) =
                        syn::parse_str::<syn::Lit>(&literal.to_string())
                    {
                        if let Some(rest) = text.value().strip_prefix("crate::") {
                            let name: String = rest
                                .chars()
                                .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
                                .collect();
                            self.names.insert(name);
                        }
                    }
                }
                _ => {}
            }
        }
    }
}

/// Each `visit_*` that holds attributes stops at a test-only node.
macro_rules! skip_test_only {
    ($($method:ident: $node:ty => $walk:path;)*) => {
        $(fn $method(&mut self, node: &'ast $node) {
            if !is_test_only(&node.attrs) {
                $walk(self, node);
            }
        })*
    };
}

impl<'ast> Visit<'ast> for CratePaths {
    fn visit_item(&mut self, item: &'ast syn::Item) {
        let attrs: &[syn::Attribute] = match item {
            syn::Item::Const(item) => &item.attrs,
            syn::Item::Enum(item) => &item.attrs,
            syn::Item::ExternCrate(item) => &item.attrs,
            syn::Item::Fn(item) => &item.attrs,
            syn::Item::ForeignMod(item) => &item.attrs,
            syn::Item::Impl(item) => &item.attrs,
            syn::Item::Macro(item) => &item.attrs,
            syn::Item::Mod(item) => &item.attrs,
            syn::Item::Static(item) => &item.attrs,
            syn::Item::Struct(item) => &item.attrs,
            syn::Item::Trait(item) => &item.attrs,
            syn::Item::TraitAlias(item) => &item.attrs,
            syn::Item::Type(item) => &item.attrs,
            syn::Item::Union(item) => &item.attrs,
            syn::Item::Use(item) => &item.attrs,
            _ => &[],
        };
        if !is_test_only(attrs) {
            visit::visit_item(self, item);
        }
    }

    skip_test_only! {
        visit_impl_item_fn: syn::ImplItemFn => visit::visit_impl_item_fn;
        visit_impl_item_const: syn::ImplItemConst => visit::visit_impl_item_const;
        visit_impl_item_type: syn::ImplItemType => visit::visit_impl_item_type;
        visit_trait_item_fn: syn::TraitItemFn => visit::visit_trait_item_fn;
        visit_field: syn::Field => visit::visit_field;
        visit_variant: syn::Variant => visit::visit_variant;
        visit_local: syn::Local => visit::visit_local;
        visit_arm: syn::Arm => visit::visit_arm;
        visit_expr_block: syn::ExprBlock => visit::visit_expr_block;
        visit_stmt_macro: syn::StmtMacro => visit::visit_stmt_macro;
    }

    fn visit_item_use(&mut self, item: &'ast syn::ItemUse) {
        self.use_tree(&item.tree, true, false);
    }

    fn visit_path(&mut self, path: &'ast syn::Path) {
        let mut segments = path.segments.iter();
        if let (Some(first), Some(second)) = (segments.next(), segments.next()) {
            if first.ident == "crate" {
                self.names.insert(second.ident.to_string());
            }
        }
        visit::visit_path(self, path);
    }

    fn visit_macro(&mut self, mac: &'ast syn::Macro) {
        self.tokens(mac.tokens.clone());
        visit::visit_macro(self, mac);
    }

    fn visit_attribute(&mut self, attr: &'ast syn::Attribute) {
        // Doc comments name paths for links, not for the compiler.
        if !attr.path().is_ident("doc") {
            if let syn::Meta::List(list) = &attr.meta {
                self.tokens(list.tokens.clone());
                self.attribute_strings(list.tokens.clone());
            }
        }
    }
}

/// The modules one file's code (test-only items left out) reaches through `crate::`.
fn crate_paths(file: &syn::File) -> BTreeSet<String> {
    let mut paths = CratePaths::default();
    paths.visit_file(file);
    paths.names
}

fn parse(path: &Path) -> syn::File {
    let text = std::fs::read_to_string(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    syn::parse_file(&text).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

/// The files of the module whose items are `items`, following its `mod name;` declarations
/// (test-only ones left out) into `dir`, where the declared modules' files are.
fn module_files(items: &[syn::Item], dir: &Path, out: &mut Vec<PathBuf>) {
    for item in items {
        let syn::Item::Mod(module) = item else {
            continue;
        };
        if is_test_only(&module.attrs) {
            continue;
        }
        let name = module.ident.to_string();
        if let Some((_, inline)) = &module.content {
            module_files(inline, &dir.join(&name), out);
            continue;
        }
        let (file, children) = match dir.join(format!("{name}.rs")) {
            file if file.is_file() => (file, dir.join(&name)),
            _ => (dir.join(&name).join("mod.rs"), dir.join(&name)),
        };
        module_files(&parse(&file).items, &children, out);
        out.push(file);
    }
}

/// `module -> imported module -> files that import it`, for every top-level module of
/// src/lib.rs; only names that are top-level modules count as imports.
fn imports() -> BTreeMap<String, BTreeMap<String, BTreeSet<String>>> {
    let modules = modules();
    let mut graph: BTreeMap<String, BTreeMap<String, BTreeSet<String>>> = BTreeMap::new();
    for module in &modules {
        let mut files = Vec::new();
        let lib_item: syn::Item = syn::parse_str(&format!("pub mod {module};")).unwrap();
        module_files(&[lib_item], &src(), &mut files);
        let entry = graph.entry(module.clone()).or_default();
        for file in files {
            let relative = file.strip_prefix(src()).unwrap().display().to_string();
            for name in crate_paths(&parse(&file)) {
                if &name != module && modules.contains(&name) {
                    entry.entry(name).or_default().insert(relative.clone());
                }
            }
        }
    }
    graph
}

#[test]
fn the_parser_reads_use_groups_and_leaves_out_test_items_anywhere_in_a_file() {
    let source = r#"
        use crate::{a, b::c};
        use std::{fmt, collections::HashMap};
        #[cfg(test)]
        use crate::test_import;
        pub fn f() -> crate::d::D {
            crate::e::run();
            format!("{}", crate::f::NAME)
        }
        #[cfg(test)]
        fn helper() { crate::test_fn::x(); }
        #[cfg(test)]
        mod tests { use crate::test_module; }
        impl X {
            #[cfg(test)]
            fn only_in_tests(&self) -> crate::test_method::T { Default::default() }
            fn g(&self) -> Vec<crate::g::G> { vec![] }
        }
        use crate::{h::{i, j::{k, l}}, m as n, o::*};
        #[derive(serde::Serialize, thiserror::Error)]
        #[error("{}", crate::r::shown(.0))]
        struct S {
            #[serde(with = "crate::p::serde_form")]
            field: u8,
        }
        /// See [`crate::in_doc`].
        fn q() {}
    "#;
    let found = crate_paths(&syn::parse_file(source).unwrap());
    let expected: BTreeSet<String> = ["a", "b", "d", "e", "f", "g", "h", "m", "o", "p", "r"]
        .map(String::from)
        .into();
    assert_eq!(found, expected);
}

#[test]
fn every_module_is_in_a_group_of_lib_rs() {
    let mut on_disk = BTreeSet::new();
    for entry in std::fs::read_dir(src()).unwrap() {
        let name = entry.unwrap().file_name().to_string_lossy().to_string();
        let name = name.trim_end_matches(".rs").to_string();
        if !["lib", "main", "cli"].contains(&name.as_str()) {
            on_disk.insert(name);
        }
    }
    assert_eq!(
        modules(),
        on_disk,
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
            if group_of[&target] > group_of[&module] {
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

/// What docs/architecture.md says of each module: the paragraph that starts with the module's
/// name in bold (`**digest**: ...`), and in it the modules its "Depends on ..." (or "Depends
/// only on ...") sentence lists, up to the sentence's end (`.` or `;`). Words in parentheses
/// explain and are left out, and so are words that are not modules of src/lib.rs ("std",
/// "pep440_rs", "nothing in cudastack"). `None`: the paragraph has no such sentence.
fn documented_dependencies(
    text: &str,
    modules: &BTreeSet<String>,
) -> BTreeMap<String, Option<BTreeSet<String>>> {
    let mut documented = BTreeMap::new();
    for paragraph in text.split("\n\n") {
        let Some(name) = paragraph
            .strip_prefix("**")
            .and_then(|rest| rest.split_once("**"))
            .map(|(name, _)| name.to_string())
        else {
            continue;
        };
        let mut listed: Option<BTreeSet<String>> = None;
        for (at, _) in paragraph.match_indices("Depends") {
            let sentence = &paragraph[at..];
            if !sentence["Depends".len()..].starts_with(char::is_whitespace) {
                continue;
            }
            let end = sentence
                .char_indices()
                .find(|&(i, c)| {
                    c == ';'
                        || (c == '.'
                            && sentence[i + 1..]
                                .chars()
                                .next()
                                .is_none_or(char::is_whitespace))
                })
                .map_or(sentence.len(), |(i, _)| i);
            let mut words = String::new();
            let mut depth = 0usize;
            for c in sentence[..end].chars() {
                match c {
                    '(' => depth += 1,
                    ')' => depth = depth.saturating_sub(1),
                    c if depth == 0 => words.push(c),
                    _ => {}
                }
            }
            let set = listed.get_or_insert_with(BTreeSet::new);
            set.extend(
                words
                    .split(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
                    .filter(|word| modules.contains(*word))
                    .map(String::from),
            );
        }
        documented.insert(name, listed);
    }
    documented
}

/// Every module of src/lib.rs has a paragraph in docs/architecture.md whose "Depends on"
/// sentence lists exactly the modules its code imports; a paragraph for a module that
/// src/lib.rs no longer declares is stale. A new module, or a new import, fails here until
/// the document says so.
#[test]
fn architecture_md_says_what_each_module_depends_on() {
    let modules = modules();
    let path = root().join("docs/architecture.md");
    let text = std::fs::read_to_string(&path).unwrap();
    let documented = documented_dependencies(&text, &modules);
    let graph = imports();
    let mut wrong = Vec::new();
    for module in &modules {
        let imported: BTreeSet<String> = graph[module].keys().cloned().collect();
        match documented.get(module) {
            None => wrong.push(format!("**{module}**: no paragraph starts with it")),
            Some(None) => wrong.push(format!(
                "**{module}**: its paragraph has no \"Depends on\" sentence; its code imports {imported:?}"
            )),
            Some(Some(listed)) if *listed != imported => {
                let unlisted: Vec<_> = imported.difference(listed).collect();
                let unused: Vec<_> = listed.difference(&imported).collect();
                wrong.push(format!(
                    "**{module}**: imported but not listed {unlisted:?}; listed but not imported {unused:?}"
                ));
            }
            Some(Some(_)) => {}
        }
    }
    for name in documented.keys() {
        // cli is the binary, not a module of the library.
        if !modules.contains(name) && name != "cli" {
            wrong.push(format!(
                "**{name}**: a paragraph for a module src/lib.rs does not declare"
            ));
        }
    }
    assert!(
        wrong.is_empty(),
        "{} disagrees with the code:\n{}",
        path.display(),
        wrong.join("\n")
    );
}

#[test]
fn the_depends_on_sentence_is_read_up_to_its_end_without_parentheses() {
    let modules: BTreeSet<String> = ["digest", "fetch", "layer", "lock", "oci", "stack"]
        .map(String::from)
        .into();
    let text = "intro\n\n**stack** (the assemblers): builds. Depends\non lock (the layer\nplan), fetch::http, digest; never oci.\n\n\
                **digest**: hashes. Depends on nothing in cudastack.\n\n**layer**: tars. Uses oci.";
    let documented = documented_dependencies(text, &modules);
    assert_eq!(
        documented["stack"],
        Some(["digest", "fetch", "lock"].map(String::from).into())
    );
    assert_eq!(documented["digest"], Some(BTreeSet::new()));
    assert_eq!(documented["layer"], None);
}

/// Comments say why the code is as it is; which issue brought it is the history's job (`git
/// log -S`, `git blame`). A comment citing an issue number reads as a changelog and goes stale,
/// and a message citing one means nothing to the user who reads it: every line of src is
/// checked, code, strings and comments.
#[test]
fn nothing_in_src_cites_an_issue_number() {
    let mut files = Vec::new();
    module_files(&parse(&src().join("lib.rs")).items, &src(), &mut files);
    files.push(src().join("lib.rs"));
    files.push(src().join("main.rs"));
    module_files(&parse(&src().join("main.rs")).items, &src(), &mut files);
    let mut citing = Vec::new();
    for file in files {
        let text = std::fs::read_to_string(&file).unwrap();
        for (number, line) in text.lines().enumerate() {
            let lower = line.to_lowercase();
            let cites = lower.match_indices("issue ").any(|(at, word)| {
                lower[at + word.len()..]
                    .chars()
                    .next()
                    .is_some_and(|c| c.is_ascii_digit())
            });
            if cites {
                citing.push(format!(
                    "{}:{}: {}",
                    file.display(),
                    number + 1,
                    line.trim()
                ));
            }
        }
    }
    assert!(
        citing.is_empty(),
        "lines citing issue numbers (say why instead):\n{}",
        citing.join("\n")
    );
}
