//! The gate itself (tests/gate, issue 17): without `CUDASTACK_REQUIRE` a missing component
//! skips, says why and is logged; with it, the test fails; a host condition never fails.
//! Each case re-runs this test binary on one `#[ignore]`d probe test with a chosen
//! environment, so the outcome is that of a real test run.

use crate::gate;

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use proc_macro2::{Delimiter, Group, TokenStream, TokenTree};
use syn::visit::{self, Visit};

/// Run the probe test `name` of this binary with `CUDASTACK_REQUIRE` set or not, logging to `log`.
fn probe(name: &str, require: bool, log: &Path) -> Output {
    let mut command = Command::new(std::env::current_exe().unwrap());
    command
        .args([
            "--ignored",
            "--exact",
            &gate::test_path(module_path!(), name),
            "--test-threads=1",
            "--nocapture",
        ])
        .env(gate::SKIP_LOG, log)
        .env_remove("CUDASTACK_OFFLINE_TESTS");
    if require {
        command.env(gate::REQUIRE, "1");
    } else {
        command.env_remove(gate::REQUIRE);
    }
    command.output().unwrap()
}

fn text(output: &Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    )
}

#[test]
#[ignore = "a probe the other tests run in a child process"]
fn probe_missing_component() {
    gate::skip("docker", "the docker CLI is not installed");
}

#[test]
#[ignore = "a probe the other tests run in a child process"]
fn probe_host_condition() {
    gate::not_applicable("/dev/shm is not a separate filesystem here");
}

#[test]
#[ignore = "a probe the other tests run in a child process"]
fn probe_switch() {
    std::env::set_var("CUDASTACK_OFFLINE_TESTS", "1");
    assert!(gate::switch(
        "CUDASTACK_OFFLINE_TESTS",
        |v| v == "1",
        "this test needs https://pypi.org"
    ));
}

#[test]
fn a_missing_component_skips_and_is_logged_without_require() {
    let work = tempfile::tempdir().unwrap();
    let log = work.path().join("skips.log");
    let output = probe("probe_missing_component", false, &log);
    assert!(output.status.success(), "{}", text(&output));
    assert!(
        text(&output).contains("SKIP: the docker CLI is not installed"),
        "{}",
        text(&output)
    );
    let logged = std::fs::read_to_string(&log).unwrap();
    assert_eq!(
        logged,
        "skip_gate::probe_missing_component\tdocker\tthe docker CLI is not installed\n"
    );
}

#[test]
fn a_missing_component_fails_the_test_under_require() {
    let work = tempfile::tempdir().unwrap();
    let log = work.path().join("skips.log");
    let output = probe("probe_missing_component", true, &log);
    assert!(!output.status.success(), "{}", text(&output));
    assert!(
        text(&output)
            .contains("required component missing: docker: the docker CLI is not installed"),
        "{}",
        text(&output)
    );
    assert!(!log.exists(), "a failure is not a skip");
}

#[test]
fn a_host_condition_skips_even_under_require_and_is_logged() {
    let work = tempfile::tempdir().unwrap();
    let log = work.path().join("skips.log");
    let output = probe("probe_host_condition", true, &log);
    assert!(output.status.success(), "{}", text(&output));
    let logged = std::fs::read_to_string(&log).unwrap();
    assert_eq!(
        logged,
        "skip_gate::probe_host_condition\thost\t/dev/shm is not a separate filesystem here\n"
    );
}

#[test]
fn a_developer_switch_skips_locally_and_fails_under_require() {
    let work = tempfile::tempdir().unwrap();
    let log = work.path().join("skips.log");
    let output = probe("probe_switch", false, &log);
    assert!(output.status.success(), "{}", text(&output));
    assert!(std::fs::read_to_string(&log)
        .unwrap()
        .contains("\tCUDASTACK_OFFLINE_TESTS\tCUDASTACK_OFFLINE_TESTS is set (this test needs https://pypi.org)\n"));
    let output = probe("probe_switch", true, &log);
    assert!(!output.status.success(), "{}", text(&output));
    assert!(
        text(&output).contains("CUDASTACK_OFFLINE_TESTS is set (this test needs https://pypi.org), which skips this test, but CUDASTACK_REQUIRE=1 forbids skipping"),
        "{}",
        text(&output)
    );
}

/// Lines appended by many threads at once stay whole (O_APPEND, one buffer per line).
#[test]
fn concurrent_skips_append_whole_lines() {
    let work = tempfile::tempdir().unwrap();
    let log = work.path().join("skips.log");
    let children: Vec<_> = (0..8)
        .map(|_| {
            let mut command = Command::new(std::env::current_exe().unwrap());
            command
                .args(["--ignored", "--exact"])
                .arg(gate::test_path(module_path!(), "probe_missing_component"))
                .env(gate::SKIP_LOG, &log)
                .env_remove(gate::REQUIRE)
                .stdout(std::process::Stdio::null())
                .stderr(std::process::Stdio::null());
            command.spawn().unwrap()
        })
        .collect();
    for mut child in children {
        assert!(child.wait().unwrap().success());
    }
    let logged = std::fs::read_to_string(&log).unwrap();
    assert_eq!(logged.lines().count(), 8, "{logged}");
    assert!(logged.lines().all(|line| line
        == "skip_gate::probe_missing_component\tdocker\tthe docker CLI is not installed"));
}

/// What a piece of code calls, as keys that name a function of tests/ when it is one: a
/// call `name(..)` is `name`, `module::name(..)` or `Type::name(..)` is `module::name` or
/// `Type::name` (so `gate::skip`), a method call is `.name`, a macro `name!`; inside a
/// macro's tokens the same, read off the identifiers before each `(`.
#[derive(Default)]
struct Calls(BTreeSet<String>);

impl Calls {
    fn of(visit: impl FnOnce(&mut Calls)) -> BTreeSet<String> {
        let mut calls = Calls::default();
        visit(&mut calls);
        calls.0
    }

    fn path(&mut self, segments: &[String]) {
        match segments {
            [.., parent, name] => self.0.insert(format!("{parent}::{name}")),
            [name] => self.0.insert(name.clone()),
            [] => false,
        };
    }

    fn tokens(&mut self, tokens: TokenStream) {
        let tokens: Vec<TokenTree> = tokens.into_iter().collect();
        let mut segments: Vec<String> = Vec::new();
        let mut method = false;
        for (at, token) in tokens.iter().enumerate() {
            match token {
                TokenTree::Ident(ident) => {
                    segments.push(ident.to_string());
                    let called = matches!(tokens.get(at + 1),
                        Some(TokenTree::Group(group)) if group.delimiter() == Delimiter::Parenthesis);
                    if called && method {
                        self.0.insert(format!(".{ident}"));
                    } else if called {
                        self.path(&segments);
                    }
                }
                TokenTree::Punct(punct) if punct.as_char() == ':' => {}
                TokenTree::Punct(punct) => {
                    segments.clear();
                    method = punct.as_char() == '.';
                }
                TokenTree::Group(group) => {
                    segments.clear();
                    method = false;
                    self.tokens(group.stream());
                }
                TokenTree::Literal(_) => segments.clear(),
            }
        }
    }
}

impl<'ast> Visit<'ast> for Calls {
    fn visit_expr_call(&mut self, call: &'ast syn::ExprCall) {
        if let syn::Expr::Path(path) = &*call.func {
            let segments: Vec<String> = path
                .path
                .segments
                .iter()
                .map(|segment| segment.ident.to_string())
                .collect();
            self.path(&segments);
        }
        visit::visit_expr_call(self, call);
    }

    fn visit_expr_method_call(&mut self, call: &'ast syn::ExprMethodCall) {
        self.0.insert(format!(".{}", call.method));
        visit::visit_expr_method_call(self, call);
    }

    fn visit_macro(&mut self, mac: &'ast syn::Macro) {
        if let Some(name) = mac.path.segments.last() {
            self.0.insert(format!("{}!", name.ident));
        }
        self.tokens(mac.tokens.clone());
    }
}

/// The gate's own calls: what reports a skip.
const GATE_CALLS: [&str; 4] = [
    "gate::skip",
    "gate::not_applicable",
    "gate::switch",
    ".report",
];

/// The macros with which a test decides its outcome.
const ASSERTIONS: [&str; 5] = [
    "assert!",
    "assert_eq!",
    "assert_ne!",
    "panic!",
    "unreachable!",
];

/// The functions defined under tests/ (the gate's own left out): per key (`name` and
/// `module::name` for a free function, `Type::name` for an associated one), the module
/// of each definition of that key and what it calls.
#[derive(Default)]
struct Functions {
    module: String,
    self_type: Option<String>,
    definitions: BTreeMap<String, Vec<(String, BTreeSet<String>)>>,
}

impl Functions {
    fn define(&mut self, name: &syn::Ident, block: &syn::Block) {
        let calls = Calls::of(|calls| calls.visit_block(block));
        let keys = match &self.self_type {
            Some(self_type) => vec![format!("{self_type}::{name}")],
            None => vec![name.to_string(), format!("{}::{name}", self.module)],
        };
        for key in keys {
            let definition = (self.module.clone(), calls.clone());
            self.definitions.entry(key).or_default().push(definition);
        }
    }

    /// A call made in `module` as the key of the function it reaches: a bare `name` is the
    /// module's own function when it has one (else an import, any function of that name).
    fn resolve<'k>(&self, module: &str, call: &'k str) -> std::borrow::Cow<'k, str> {
        let own = format!("{module}::{call}");
        if !call.contains("::") && self.definitions.contains_key(&own) {
            own.into()
        } else {
            call.into()
        }
    }

    /// Whether `calls`, made in `module`, reach one of `gates`.
    fn reach(&self, module: &str, calls: &BTreeSet<String>, gates: &BTreeSet<String>) -> bool {
        calls
            .iter()
            .any(|call| gates.contains(self.resolve(module, call).as_ref()))
    }
}

impl<'ast> Visit<'ast> for Functions {
    fn visit_item_fn(&mut self, function: &'ast syn::ItemFn) {
        self.define(&function.sig.ident, &function.block);
        visit::visit_item_fn(self, function);
    }

    fn visit_item_impl(&mut self, item: &'ast syn::ItemImpl) {
        let self_type = match &*item.self_ty {
            syn::Type::Path(path) => path.path.segments.last().map(|s| s.ident.to_string()),
            _ => None,
        };
        let outer = std::mem::replace(&mut self.self_type, self_type);
        visit::visit_item_impl(self, item);
        self.self_type = outer;
    }

    fn visit_impl_item_fn(&mut self, function: &'ast syn::ImplItemFn) {
        self.define(&function.sig.ident, &function.block);
        visit::visit_impl_item_fn(self, function);
    }
}

/// The keys whose call reports through the gate: the gate's calls, and every key all of
/// whose definitions make such a call, directly or through other such keys.
fn gate_keys(functions: &Functions) -> BTreeSet<String> {
    let mut gates: BTreeSet<String> = GATE_CALLS.map(String::from).into();
    loop {
        let more: Vec<String> = functions
            .definitions
            .iter()
            .filter(|(key, definitions)| {
                !gates.contains(*key)
                    && definitions
                        .iter()
                        .all(|(module, calls)| functions.reach(module, calls, &gates))
            })
            .map(|(key, _)| key.clone())
            .collect();
        if more.is_empty() {
            return gates;
        }
        gates.extend(more);
    }
}

/// The early returns of one file's tests that do not go through the gate.
struct EarlyReturns<'a> {
    functions: &'a Functions,
    gates: &'a BTreeSet<String>,
    file: String,
    module: String,
    test: String,
    /// What the conditions that lead here call: `if` conditions, `let ... else`
    /// initialisers, `match` scrutinees, from the test's top down.
    guards: Vec<BTreeSet<String>>,
    /// Per enclosing block, what its statements before the current one call.
    before: Vec<BTreeSet<String>>,
    found: Vec<String>,
}

impl EarlyReturns<'_> {
    fn guarded(&mut self, guard: &syn::Expr, visit: impl FnOnce(&mut Self)) {
        self.guards.push(Calls::of(|calls| calls.visit_expr(guard)));
        visit(self);
        self.guards.pop();
    }
}

/// Whether `attrs` make a test CI runs: `#[test]` or `#[tokio::test]`, without `#[ignore]`.
fn is_test_ci_runs(attrs: &[syn::Attribute]) -> bool {
    let named = |name: &str| {
        attrs
            .iter()
            .any(|attr| attr.path().segments.last().is_some_and(|s| s.ident == name))
    };
    named("test") && !named("ignore")
}

impl<'ast> Visit<'ast> for EarlyReturns<'_> {
    fn visit_item_fn(&mut self, function: &'ast syn::ItemFn) {
        // A nested function or a helper: its returns leave it, not a test.
        if self.test.is_empty() && is_test_ci_runs(&function.attrs) {
            self.test = function.sig.ident.to_string();
            self.visit_block(&function.block);
            self.test.clear();
        }
    }

    fn visit_expr_closure(&mut self, _: &'ast syn::ExprClosure) {}

    /// A `macro_rules!` body is pasted into the tests that invoke it: its returns are theirs.
    /// Bodies that do not parse as a block (with `$(...)*` repetitions) are not read.
    fn visit_item_macro(&mut self, item: &'ast syn::ItemMacro) {
        let Some(name) = &item.ident else {
            return;
        };
        if !self.test.is_empty() || !item.mac.path.is_ident("macro_rules") {
            return;
        }
        let tokens: Vec<TokenTree> = item.mac.tokens.clone().into_iter().collect();
        for window in tokens.windows(3) {
            let [TokenTree::Punct(equals), TokenTree::Punct(greater), TokenTree::Group(body)] =
                window
            else {
                continue;
            };
            if equals.as_char() != '=' || greater.as_char() != '>' {
                continue;
            }
            let braced = TokenTree::Group(Group::new(Delimiter::Brace, body.stream()));
            if let Ok(block) = syn::parse2::<syn::Block>(braced.into()) {
                self.test = format!("macro_rules! {name}");
                self.visit_block(&block);
                self.test.clear();
            }
        }
    }

    fn visit_block(&mut self, block: &'ast syn::Block) {
        self.before.push(BTreeSet::new());
        for statement in &block.stmts {
            self.visit_stmt(statement);
            let calls = Calls::of(|calls| calls.visit_stmt(statement));
            self.before.last_mut().unwrap().extend(calls);
        }
        self.before.pop();
    }

    fn visit_expr_if(&mut self, expr: &'ast syn::ExprIf) {
        self.visit_expr(&expr.cond);
        self.guarded(&expr.cond, |scan| {
            scan.visit_block(&expr.then_branch);
            if let Some((_, otherwise)) = &expr.else_branch {
                scan.visit_expr(otherwise);
            }
        });
    }

    fn visit_local(&mut self, local: &'ast syn::Local) {
        let Some(init) = &local.init else {
            return;
        };
        self.visit_expr(&init.expr);
        if let Some((_, otherwise)) = &init.diverge {
            self.guarded(&init.expr, |scan| scan.visit_expr(otherwise));
        }
    }

    fn visit_expr_match(&mut self, expr: &'ast syn::ExprMatch) {
        self.visit_expr(&expr.expr);
        self.guarded(&expr.expr, |scan| {
            for arm in &expr.arms {
                scan.visit_arm(arm);
            }
        });
    }

    fn visit_expr_return(&mut self, expr: &'ast syn::ExprReturn) {
        // What leads to the return, and the returned value (`return gate::skip(..)`).
        let mut on_the_way: BTreeSet<String> = self
            .guards
            .iter()
            .chain(&self.before)
            .flatten()
            .cloned()
            .collect();
        on_the_way.extend(Calls::of(|calls| calls.visit_expr_return(expr)));
        let gated = self.functions.reach(&self.module, &on_the_way, self.gates);
        let decided = self
            .before
            .last()
            .is_some_and(|calls| ASSERTIONS.iter().any(|a| calls.contains(*a)));
        if !self.test.is_empty() && !gated && !decided {
            self.found.push(format!(
                "{}:{}: {} returns without the gate",
                self.file,
                expr.return_token.span.start().line,
                self.test
            ));
        }
        visit::visit_expr_return(self, expr);
    }
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

/// Every file under tests/, parsed, with its path and its module's name.
fn test_files() -> Vec<(String, String, syn::File)> {
    let tests = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests");
    let mut paths = Vec::new();
    rust_files(&tests, &mut paths);
    paths.sort();
    paths
        .iter()
        .map(|path| {
            let relative = format!("tests/{}", path.strip_prefix(&tests).unwrap().display());
            let text = std::fs::read_to_string(path).unwrap();
            let file = syn::parse_file(&text).unwrap_or_else(|e| panic!("{relative}: {e}"));
            let module = match path.file_stem().unwrap().to_string_lossy() {
                stem if stem == "mod" => path
                    .parent()
                    .unwrap()
                    .file_name()
                    .unwrap()
                    .to_string_lossy()
                    .to_string(),
                stem => stem.to_string(),
            };
            (relative, module, file)
        })
        .collect()
}

/// No test skips past the gate: every `return` in a test that CI runs (`#[test]` or
/// `#[tokio::test]`, not `#[ignore]`d; in its own body, not in a closure or a nested
/// function) goes through the gate on its way. On its way are the conditions that lead to
/// it (each enclosing `if` condition, `let ... else` initialiser and `match` scrutinee) and
/// the statements before it in its block and in every enclosing block; one of them must
/// call the gate (`gate::skip`, `gate::not_applicable`, `gate::switch`, `.report()`) or a
/// function of tests/ that does (`skip_without_gcc`, `minbase_archive`, `Fixture::start`,
/// ..., directly or through others). Functions are known by `name`, `module::name` or
/// `Type::name` (a bare `name` is the calling file's own function when it has one), and
/// one counts only when every definition under that key calls the gate, so a
/// `skip_reason` that only builds a `Skip` needs its `.report()` beside the return.
/// A return right after an assertion in its block is the test's outcome, not a skip.
/// The bodies of the `macro_rules!` of tests/ are read as if they were tests (they are
/// pasted into tests); other macros are not expanded.
#[test]
fn no_test_returns_early_without_the_gate() {
    let found = early_returns_past_the_gate(&test_files());
    assert!(
        found.is_empty(),
        "early returns past the gate (report the skip through tests/gate first):\n{}",
        found.join("\n")
    );
}

/// The returns `files` (path, module, syntax) make past the gate, as `path:line: test ...`.
fn early_returns_past_the_gate(files: &[(String, String, syn::File)]) -> Vec<String> {
    let mut functions = Functions::default();
    for (path, module, file) in files {
        if !path.starts_with("tests/gate/") {
            functions.module = module.clone();
            functions.visit_file(file);
        }
    }
    let gates = gate_keys(&functions);
    let mut found = Vec::new();
    for (path, module, file) in files {
        let mut scan = EarlyReturns {
            functions: &functions,
            gates: &gates,
            file: path.clone(),
            module: module.clone(),
            test: String::new(),
            guards: Vec::new(),
            before: Vec::new(),
            found: Vec::new(),
        };
        scan.visit_file(file);
        found.extend(scan.found);
    }
    found
}

#[test]
fn the_scan_tells_a_gated_return_from_a_bare_one() {
    let source = r#"
        fn skip_reason() -> Option<Skip> { None }
        fn skip_without_gcc() -> bool { gate::skip("gcc", "no gcc"); true }
        macro_rules! require { () => { if let Some(r) = skip_reason() { eprintln!("{r}"); return; } }; }
        #[test]
        fn reported() { if let Some(r) = skip_reason() { r.report(); return; } }
        #[test]
        fn through_a_helper() { if skip_without_gcc() { return; } }
        #[test]
        fn returned_gate() { let Some(x) = other() else { return gate::not_applicable("x") }; }
        #[test]
        fn decided() { if flag() { assert_eq!(1, 1); return; } }
        #[test]
        fn bare() {
            let Some(dir) = other() else {
                eprintln!("skipped");
                return;
            };
        }
        #[test]
        fn printed() { if let Some(r) = skip_reason() { eprintln!("skipped: {r}"); return; } }
        #[test]
        #[ignore = "a child"]
        fn child() { let Ok(v) = std::env::var("CHILD") else { return; }; }
        #[test]
        fn in_a_closure() { std::thread::spawn(|| { if done() { return; } }); }
    "#;
    let file = syn::parse_file(source).unwrap();
    let found = early_returns_past_the_gate(&[("tests/t.rs".into(), "t".into(), file)]);
    assert_eq!(
        found,
        [
            "tests/t.rs:4: macro_rules! require returns without the gate",
            "tests/t.rs:17: bare returns without the gate",
            "tests/t.rs:21: printed returns without the gate",
        ]
    );
}
