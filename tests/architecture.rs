//! The house as its imports draw it: no circle between the files of `src/`, and no file that
//! imports from a floor above its own (docs/layout.md names the floors).
//!
//! The graph is read from the source, not from the compiler: each file under `src/` is a node
//! (the library's modules, and the binary's `main.rs` and `cli/`), and an edge is
//! - a `use` path that starts with `crate::`, `super::` or `self::`, or with a child module's
//!   name (`use lease::Claimed` in `store/mod.rs`), braces expanded;
//! - any other path in the code that starts the same way (`crate::process::hostname()`,
//!   `super::tx::transaction(..)`, `enqueue::enqueue(..)` in the child's parent).
//!
//! A path names the deepest file it reaches; a name a parent re-exports (`pub use lease::Claimed`
//! in `store/mod.rs`) is followed to the file that defines it. What it does not see: the
//! re-exports and `mod` lines themselves (a parent's table of contents, not a use of its
//! children), comments and string literals, test code (`#[cfg(test)]` items, the files they
//! declare, `tests.rs`), paths through the library's name in the binary (`leasehold::…`,
//! which only reach down), macros' bodies expanded elsewhere, and a name brought in by a glob
//! (it sees the edge to the glob's module, not which names came through).

use std::collections::{BTreeMap, BTreeSet};
use std::fs;
use std::path::{Path, PathBuf};

/// The floors, lowest first: a file imports from its own floor or below, never above. A
/// module not named here is a failure, so a new top-level module must be placed.
const FLOORS: &[(&str, &[&str])] = &[
    (
        "model",
        &[
            "error",
            "job",
            "manners",
            "schedule",
            "metrics",
            "condition",
        ],
    ),
    // files.rs names an attempt's folders after the database's canonical place, which for
    // PostgreSQL is named after the URL and this host (store/wake.rs): it sits beside them.
    ("store and process", &["store", "process", "files"]),
    ("runner", &["runner", "protocol"]),
    ("top", &["", "testing", "fuzzing", "bin"]),
];

/// A module: its crate ("lib" or "bin") and its path inside it.
type Module = Vec<String>;

struct Source {
    /// The file, for messages.
    file: PathBuf,
    /// The code without comments, string literals and test items.
    code: String,
}

fn src() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("src")
}

/// Every `.rs` file under `dir`, sorted.
fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) {
    let mut entries: Vec<PathBuf> = fs::read_dir(dir)
        .expect("src/ is readable")
        .map(|entry| entry.expect("an entry of src/ is readable").path())
        .collect();
    entries.sort();
    for path in entries {
        if path.is_dir() {
            rust_files(&path, out);
        } else if path.extension().is_some_and(|ext| ext == "rs") {
            out.push(path);
        }
    }
}

/// The module a file holds: `src/store/mod.rs` is `lib::store`, `src/cli/jobs.rs` is
/// `bin::cli::jobs`, `src/main.rs` is `bin`.
fn module_of(file: &Path) -> Module {
    let relative = file.strip_prefix(src()).expect("a file under src/");
    let mut parts: Vec<String> = relative
        .iter()
        .map(|part| part.to_string_lossy().into_owned())
        .collect();
    let last = parts.pop().expect("a file name");
    let stem = last.trim_end_matches(".rs");
    let krate = if parts.first().is_some_and(|first| first == "cli") || stem == "main" {
        "bin"
    } else {
        "lib"
    };
    if !matches!(stem, "mod" | "lib" | "main") {
        parts.push(stem.to_string());
    }
    let mut module = vec![krate.to_string()];
    module.extend(parts);
    module
}

/// The code of a Rust file with comments and the contents of string and char literals
/// removed (a lifetime stays).
fn strip(text: &str) -> String {
    let chars: Vec<char> = text.chars().collect();
    let mut out = String::with_capacity(text.len());
    let mut i = 0;
    while i < chars.len() {
        let c = chars[i];
        let next = chars.get(i + 1).copied();
        if c == '/' && next == Some('/') {
            while i < chars.len() && chars[i] != '\n' {
                i += 1;
            }
        } else if c == '/' && next == Some('*') {
            let mut depth = 0;
            while i < chars.len() {
                if chars[i] == '/' && chars.get(i + 1) == Some(&'*') {
                    depth += 1;
                    i += 2;
                } else if chars[i] == '*' && chars.get(i + 1) == Some(&'/') {
                    depth -= 1;
                    i += 2;
                    if depth == 0 {
                        break;
                    }
                } else {
                    i += 1;
                }
            }
        } else if c == 'r'
            && (next == Some('#') || next == Some('"'))
            && !ident_char_before(&chars, i)
        {
            // A raw string: r"…" or r#"…"#.
            let mut hashes = 0;
            let mut j = i + 1;
            while chars.get(j) == Some(&'#') {
                hashes += 1;
                j += 1;
            }
            if chars.get(j) != Some(&'"') {
                out.push(c);
                i += 1;
                continue;
            }
            j += 1;
            loop {
                if j >= chars.len() {
                    break;
                }
                if chars[j] == '"' && (0..hashes).all(|k| chars.get(j + 1 + k) == Some(&'#')) {
                    j += 1 + hashes;
                    break;
                }
                j += 1;
            }
            out.push_str("\"\"");
            i = j;
        } else if c == '"' {
            i += 1;
            while i < chars.len() && chars[i] != '"' {
                if chars[i] == '\\' {
                    i += 1;
                }
                i += 1;
            }
            i += 1;
            out.push_str("\"\"");
        } else if c == '\'' && (next == Some('\\') || chars.get(i + 2) == Some(&'\'')) {
            // A char literal ('a', '\n', '\''); a lifetime ('a) has no closing quote.
            i += 1;
            if chars.get(i) == Some(&'\\') {
                i += 1;
            }
            i += 1;
            while i < chars.len() && chars[i] != '\'' {
                i += 1;
            }
            i += 1;
            out.push_str("' '");
        } else {
            out.push(c);
            i += 1;
        }
    }
    out
}

fn ident_char_before(chars: &[char], i: usize) -> bool {
    i > 0 && (chars[i - 1].is_alphanumeric() || chars[i - 1] == '_')
}

/// The code without `#[cfg(test)]` items, and the names of the modules they declare.
fn drop_tests(code: &str) -> (String, Vec<String>) {
    const MARK: &str = "#[cfg(test)]";
    let mut out = String::with_capacity(code.len());
    let mut test_mods = Vec::new();
    let mut rest = code;
    while let Some(at) = rest.find(MARK) {
        out.push_str(&rest[..at]);
        let item = &rest[at + MARK.len()..];
        // The item ends at the first `;` outside braces, or at its block's closing brace.
        let mut depth = 0usize;
        let mut end = item.len();
        for (k, c) in item.char_indices() {
            match c {
                '{' => depth += 1,
                '}' => {
                    depth = depth.saturating_sub(1);
                    if depth == 0 {
                        end = k + 1;
                        break;
                    }
                }
                ';' if depth == 0 => {
                    end = k + 1;
                    break;
                }
                _ => {}
            }
        }
        let words: Vec<&str> = item[..end]
            .split(|c: char| !(c.is_alphanumeric() || c == '_'))
            .filter(|w| !w.is_empty())
            .collect();
        if let Some(pos) = words.iter().position(|w| *w == "mod") {
            if item[..end].trim_end().ends_with(';') {
                if let Some(name) = words.get(pos + 1) {
                    test_mods.push((*name).to_string());
                }
            }
        }
        rest = &item[end..];
    }
    out.push_str(rest);
    (out, test_mods)
}

/// The paths of a `use` tree's text (`crate::a::{b, c::{d as e, self}}`), each as segments.
fn expand_use(tree: &str) -> Vec<Vec<String>> {
    let mut paths = Vec::new();
    expand_into(tree, Vec::new(), &mut paths);
    paths
}

fn expand_into(tree: &str, prefix: Vec<String>, out: &mut Vec<Vec<String>>) {
    for part in split_top(tree) {
        let part = part.trim();
        if let Some(open) = part.find('{') {
            let head = part[..open].trim().trim_end_matches("::");
            let mut next = prefix.clone();
            next.extend(segments(head));
            let inner = &part[open + 1..part.len() - 1];
            expand_into(inner, next, out);
        } else {
            // `a::b as c`: the path is before the rename.
            let part = part.split_whitespace().next().unwrap_or(part);
            let mut path = prefix.clone();
            for segment in segments(part) {
                if segment != "self" || path.is_empty() {
                    path.push(segment);
                }
            }
            if !path.is_empty() {
                out.push(path);
            }
        }
    }
}

/// `a,b::{c,d},e` split at the commas outside braces.
fn split_top(tree: &str) -> Vec<&str> {
    let mut parts = Vec::new();
    let mut depth = 0;
    let mut start = 0;
    for (k, c) in tree.char_indices() {
        match c {
            '{' => depth += 1,
            '}' => depth -= 1,
            ',' if depth == 0 => {
                parts.push(&tree[start..k]);
                start = k + 1;
            }
            _ => {}
        }
    }
    parts.push(&tree[start..]);
    parts.into_iter().filter(|p| !p.trim().is_empty()).collect()
}

fn segments(path: &str) -> Vec<String> {
    path.split("::")
        .filter(|s| !s.is_empty() && *s != "*")
        .map(str::to_string)
        .collect()
}

/// Every `use` path of the code, and the code with the `use` items removed. A `pub use` (a
/// re-export) is returned apart from the others.
fn uses(code: &str) -> (Vec<Vec<String>>, Vec<Vec<String>>, String) {
    let mut imports = Vec::new();
    let mut reexports = Vec::new();
    let mut rest_code = String::with_capacity(code.len());
    let mut rest = code;
    loop {
        let Some(at) = find_word(rest, "use") else {
            rest_code.push_str(rest);
            break;
        };
        let before = &rest[..at];
        let end = rest[at..].find(';').map_or(rest.len(), |k| at + k);
        let tree = &rest[at + 3..end];
        let public = before.trim_end().ends_with("pub")
            || before.trim_end().ends_with(')') && {
                let trimmed = before.trim_end();
                trimmed
                    .rfind("pub(")
                    .is_some_and(|p| !trimmed[p..].contains(';'))
            };
        rest_code.push_str(before);
        let paths = expand_use(tree.trim().trim_start_matches("::"));
        if public {
            reexports.extend(paths);
        } else {
            imports.extend(paths);
        }
        rest = &rest[(end + 1).min(rest.len())..];
    }
    (imports, reexports, rest_code)
}

/// Where `word` first stands alone in `text`.
fn find_word(text: &str, word: &str) -> Option<usize> {
    let bytes = text.as_bytes();
    let mut from = 0;
    while let Some(k) = text[from..].find(word) {
        let at = from + k;
        let before_ok = at == 0 || !is_ident(bytes[at - 1]);
        let after = at + word.len();
        let after_ok = after >= bytes.len() || !is_ident(bytes[after]);
        if before_ok && after_ok {
            return Some(at);
        }
        from = after;
    }
    None
}

fn is_ident(b: u8) -> bool {
    b.is_ascii_alphanumeric() || b == b'_'
}

/// Every path `a::b::c` in the code (outside `use` items), as segments.
fn code_paths(code: &str) -> Vec<Vec<String>> {
    let bytes = code.as_bytes();
    let mut paths = Vec::new();
    let mut i = 0;
    while i < bytes.len() {
        if is_ident(bytes[i]) && (i == 0 || !is_ident(bytes[i - 1]) && bytes[i - 1] != b':') {
            let start = i;
            let mut path = Vec::new();
            let mut j = i;
            loop {
                let seg_start = j;
                while j < bytes.len() && is_ident(bytes[j]) {
                    j += 1;
                }
                if seg_start == j {
                    break;
                }
                path.push(code[seg_start..j].to_string());
                if code[j..].starts_with("::") && j + 2 < bytes.len() && is_ident(bytes[j + 2]) {
                    j += 2;
                } else {
                    break;
                }
            }
            if path.len() > 1 {
                paths.push(path);
            }
            i = j.max(start + 1);
        } else {
            i += 1;
        }
    }
    paths
}

struct House {
    /// Each module's file and code.
    sources: BTreeMap<Module, Source>,
    /// The names each module re-exports, and the module each comes from.
    reexports: BTreeMap<Module, BTreeMap<String, Vec<String>>>,
}

impl House {
    fn read() -> House {
        let mut files = Vec::new();
        rust_files(&src(), &mut files);
        let mut sources = BTreeMap::new();
        let mut test_modules = BTreeSet::new();
        for file in files {
            let text = fs::read_to_string(&file).expect("a source file is readable");
            let (code, test_mods) = drop_tests(&strip(&text));
            let module = module_of(&file);
            for name in test_mods {
                let mut child = module.clone();
                child.push(name);
                test_modules.insert(child);
            }
            sources.insert(module, Source { file, code });
        }
        sources.retain(|module, _| {
            module.last().is_none_or(|m| m != "tests")
                && !(1..=module.len()).any(|n| test_modules.contains(&module[..n]))
        });
        let mut house = House {
            sources,
            reexports: BTreeMap::new(),
        };
        let modules: Vec<Module> = house.sources.keys().cloned().collect();
        for module in modules {
            let (_, reexports, _) = uses(&house.sources[&module].code);
            let mut names = BTreeMap::new();
            for path in reexports {
                if let Some(absolute) = house.absolute(&module, &path) {
                    let name = path.last().expect("a path has a segment").clone();
                    names.insert(name, absolute);
                }
            }
            house.reexports.insert(module, names);
        }
        house
    }

    /// The path made absolute (starting with its crate), or `None` for another crate's.
    fn absolute(&self, module: &Module, path: &[String]) -> Option<Vec<String>> {
        let first = path.first()?;
        let mut base: Vec<String>;
        let rest: &[String];
        match first.as_str() {
            "crate" => {
                base = vec![module[0].clone()];
                rest = &path[1..];
            }
            "self" => {
                base = module.clone();
                rest = &path[1..];
            }
            "super" => {
                base = module.clone();
                let mut k = 0;
                while path.get(k).is_some_and(|s| s == "super") {
                    base.pop();
                    k += 1;
                }
                rest = &path[k..];
            }
            _ => {
                let mut child = module.clone();
                child.push(first.clone());
                if !self.sources.contains_key(&child) {
                    return None;
                }
                base = module.clone();
                rest = path;
            }
        }
        base.extend(rest.iter().cloned());
        Some(base)
    }

    /// The file an absolute path lands in: its deepest module, and through a re-export of
    /// the next name to where that name is defined.
    fn target(&self, path: &[String], hops: usize) -> Option<Module> {
        let mut depth = path.len();
        while depth > 0 && !self.sources.contains_key(&path[..depth]) {
            depth -= 1;
        }
        if depth == 0 {
            return None;
        }
        let module = path[..depth].to_vec();
        if let (Some(name), true) = (path.get(depth), hops < 8) {
            if let Some(source) = self.reexports.get(&module).and_then(|r| r.get(name)) {
                let mut next = source.clone();
                next.extend(path[depth + 1..].iter().cloned());
                if let Some(found) = self.target(&next, hops + 1) {
                    return Some(found);
                }
            }
        }
        Some(module)
    }

    /// The modules each module imports from, other than itself.
    fn edges(&self) -> BTreeMap<Module, BTreeSet<Module>> {
        let mut edges = BTreeMap::new();
        for (module, source) in &self.sources {
            let (imports, _, rest) = uses(&source.code);
            let mut to = BTreeSet::new();
            for path in imports.iter().chain(code_paths(&rest).iter()) {
                let Some(absolute) = self.absolute(module, path) else {
                    continue;
                };
                if let Some(target) = self.target(&absolute, 0) {
                    // A module's use of its own parts is the tree, not an edge.
                    if !target.starts_with(module) {
                        to.insert(target);
                    }
                }
            }
            edges.insert(module.clone(), to);
        }
        edges
    }
}

fn name(module: &Module) -> String {
    let path = module[1..].join("::");
    match (module[0].as_str(), path.is_empty()) {
        ("lib", true) => "lib".to_string(),
        ("bin", true) => "main".to_string(),
        ("lib", false) => path,
        _ => path,
    }
}

/// The floor of a module, by its first segment (the binary's are all on the top floor).
fn floor(module: &Module) -> Option<usize> {
    let top = if module[0] == "bin" {
        "bin"
    } else {
        module.get(1).map_or("", String::as_str)
    };
    FLOORS.iter().position(|(_, names)| names.contains(&top))
}

/// The strongly connected components with more than one module (Tarjan's algorithm).
fn circles(edges: &BTreeMap<Module, BTreeSet<Module>>) -> Vec<Vec<Module>> {
    struct State<'a> {
        edges: &'a BTreeMap<Module, BTreeSet<Module>>,
        index: BTreeMap<&'a Module, usize>,
        low: BTreeMap<&'a Module, usize>,
        stack: Vec<&'a Module>,
        on_stack: BTreeSet<&'a Module>,
        found: Vec<Vec<Module>>,
    }
    fn visit<'a>(state: &mut State<'a>, v: &'a Module) {
        let n = state.index.len();
        state.index.insert(v, n);
        state.low.insert(v, n);
        state.stack.push(v);
        state.on_stack.insert(v);
        for w in state.edges.get(v).into_iter().flatten() {
            let Some((w, _)) = state.edges.get_key_value(w) else {
                continue;
            };
            if !state.index.contains_key(w) {
                visit(state, w);
                let low = state.low[v].min(state.low[w]);
                state.low.insert(v, low);
            } else if state.on_stack.contains(w) {
                let low = state.low[v].min(state.index[w]);
                state.low.insert(v, low);
            }
        }
        if state.low[v] == state.index[v] {
            let mut component = Vec::new();
            loop {
                let w = state.stack.pop().expect("v is on the stack");
                state.on_stack.remove(w);
                component.push(w.clone());
                if w == v {
                    break;
                }
            }
            if component.len() > 1 {
                component.sort();
                state.found.push(component);
            }
        }
    }
    let mut state = State {
        edges,
        index: BTreeMap::new(),
        low: BTreeMap::new(),
        stack: Vec::new(),
        on_stack: BTreeSet::new(),
        found: Vec::new(),
    };
    for v in edges.keys() {
        if !state.index.contains_key(v) {
            visit(&mut state, v);
        }
    }
    state.found
}

/// One loop through a component: from its first module along edges inside it, back to it.
fn one_loop(component: &[Module], edges: &BTreeMap<Module, BTreeSet<Module>>) -> Vec<Module> {
    let inside: BTreeSet<&Module> = component.iter().collect();
    let start = &component[0];
    // Breadth-first from start's successors back to start: the shortest loop through it.
    let mut parent: BTreeMap<&Module, &Module> = BTreeMap::new();
    let mut queue = std::collections::VecDeque::new();
    queue.push_back(start);
    while let Some(v) = queue.pop_front() {
        for w in edges.get(v).into_iter().flatten() {
            if !inside.contains(w) {
                continue;
            }
            if w == start {
                let mut path = vec![v.clone()];
                let mut at = v;
                while at != start {
                    at = parent[at];
                    path.push(at.clone());
                }
                path.reverse();
                path.push(start.clone());
                return path;
            }
            if !parent.contains_key(w) && w != start {
                let (w, _) = edges.get_key_value(w).expect("w is a module");
                parent.insert(w, v);
                queue.push_back(w);
            }
        }
    }
    component.to_vec()
}

/// The circles not broken yet, each as its modules sorted: none is left. Should one ever have
/// to wait, it is listed here; the test fails on a circle not listed, and on a listed one that
/// is gone (strike it).
const NOT_YET: &[&[&str]] = &[];

#[test]
fn the_import_graph_has_no_circle() {
    let house = House::read();
    let edges = house.edges();
    let found = circles(&edges);
    let names_of = |component: &Vec<Module>| component.iter().map(name).collect::<Vec<_>>();
    let gone: Vec<&&[&str]> = NOT_YET
        .iter()
        .filter(|known| !found.iter().any(|c| names_of(c) == **known))
        .collect();
    assert!(
        gone.is_empty(),
        "circles broken, strike them from NOT_YET: {gone:?}"
    );
    let described: Vec<String> = found
        .iter()
        .filter(|component| !NOT_YET.iter().any(|known| names_of(component) == **known))
        .map(|component| {
            let names: Vec<String> = component.iter().map(name).collect();
            let path: Vec<String> = one_loop(component, &edges).iter().map(name).collect();
            format!("{{{}}}, e.g. {}", names.join(", "), path.join(" -> "))
        })
        .collect();
    assert!(
        described.is_empty(),
        "{} import circle(s):\n{}",
        described.len(),
        described.join("\n")
    );
}

#[test]
fn no_file_imports_from_a_floor_above_its_own() {
    let house = House::read();
    let mut wrong = Vec::new();
    for (from, targets) in house.edges() {
        let Some(own) = floor(&from) else {
            wrong.push(format!(
                "{} is on no floor (tests/architecture.rs FLOORS)",
                name(&from)
            ));
            continue;
        };
        for to in targets {
            if floor(&to).is_some_and(|theirs| theirs > own) {
                wrong.push(format!(
                    "{} ({}) imports {} ({})",
                    name(&from),
                    FLOORS[own].0,
                    name(&to),
                    FLOORS[floor(&to).expect("checked")].0
                ));
            }
        }
    }
    assert!(
        wrong.is_empty(),
        "imports from above:\n{}",
        wrong.join("\n")
    );
}

/// The checks see what they claim to: a known edge of each kind.
#[test]
fn the_graph_sees_each_kind_of_import() {
    let house = House::read();
    let edges = house.edges();
    let has = |from: &str, to: &str| {
        let find = |n: &str| {
            edges
                .keys()
                .find(|m| name(m) == n)
                .unwrap_or_else(|| panic!("no module {n}"))
                .clone()
        };
        edges[&find(from)].contains(&find(to))
    };
    // `use super::tx::…` in a child, a re-export followed to its file, and a path in code.
    assert!(has("store::lease", "store::tx"));
    assert!(
        has("runner::worker", "store::lease"),
        "a re-export followed to its file"
    );
    assert!(has("cli::jobs", "cli::render"));
}

#[test]
#[ignore = "prints the graph: cargo test --test architecture -- --ignored --nocapture"]
fn print_the_graph() {
    let house = House::read();
    for (from, targets) in house.edges() {
        let names: Vec<String> = targets.iter().map(name).collect();
        println!(
            "{} ({}) -> {}",
            name(&from),
            house.sources[&from].file.display(),
            names.join(", ")
        );
    }
}
