//! The README and `docs/*.md` as a reader meets them: every relative link names a file that
//! exists and, with a `#fragment`, a heading in it (as GitHub spells a heading's anchor), and
//! the README stays short enough to read. The README's Rust examples are compiled as doc
//! tests (`src/lib.rs`, `ReadmeDoctests`).

use std::collections::HashSet;
use std::fs;
use std::path::{Path, PathBuf};

/// The README's most lines: past them, detail belongs in `docs/`.
const README_MAX_LINES: usize = 450;

/// The crate's root, where README.md and docs/ are.
fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// README.md and every `docs/*.md`, sorted.
fn markdown_files() -> Vec<PathBuf> {
    let mut files = vec![root().join("README.md")];
    let mut docs: Vec<PathBuf> = fs::read_dir(root().join("docs"))
        .expect("docs/ is readable")
        .map(|entry| entry.expect("a docs/ entry is readable").path())
        .filter(|path| path.extension().is_some_and(|ext| ext == "md"))
        .collect();
    docs.sort();
    files.extend(docs);
    files
}

/// The lines of `text` outside fenced code blocks, with their numbers (from 1).
fn prose_lines(text: &str) -> Vec<(usize, &str)> {
    let mut fenced = false;
    let mut lines = Vec::new();
    for (i, line) in text.lines().enumerate() {
        if line.trim_start().starts_with("```") {
            fenced = !fenced;
            continue;
        }
        if !fenced {
            lines.push((i + 1, line));
        }
    }
    lines
}

/// GitHub's anchor of a heading's text: lowercase, backticks and punctuation dropped (but `-`
/// and `_`), each space a `-`.
fn slug(heading: &str) -> String {
    heading
        .trim()
        .to_lowercase()
        .chars()
        .filter(|c| c.is_alphanumeric() || matches!(c, ' ' | '-' | '_'))
        .map(|c| if c == ' ' { '-' } else { c })
        .collect()
}

/// The anchors of a Markdown file's headings; a repeated heading's later anchors get `-1`,
/// `-2`… as on GitHub.
fn anchors(text: &str) -> HashSet<String> {
    let mut seen = HashSet::new();
    for (_, line) in prose_lines(text) {
        let hashes = line.len() - line.trim_start_matches('#').len();
        if hashes == 0 || hashes > 6 || !line[hashes..].starts_with(' ') {
            continue;
        }
        let base = slug(&line[hashes..]);
        let mut anchor = base.clone();
        let mut n = 0;
        while seen.contains(&anchor) {
            n += 1;
            anchor = format!("{base}-{n}");
        }
        seen.insert(anchor);
    }
    seen
}

/// The targets of the inline links `[text](target)` on a line, outside inline code.
fn link_targets(line: &str) -> Vec<String> {
    let mut targets = Vec::new();
    let mut in_code = false;
    let bytes = line.as_bytes();
    let mut i = 0;
    while i < bytes.len() {
        match bytes[i] {
            b'`' => in_code = !in_code,
            b']' if !in_code && bytes.get(i + 1) == Some(&b'(') => {
                if let Some(len) = line[i + 2..].find(')') {
                    targets.push(line[i + 2..i + 2 + len].to_string());
                    i += 2 + len;
                }
            }
            _ => {}
        }
        i += 1;
    }
    targets
}

/// Each broken relative link in `file`, as `file:line: target (why)`.
fn broken_links(file: &Path) -> Vec<String> {
    let text = fs::read_to_string(file).expect("a Markdown file is readable");
    let dir = file.parent().expect("a file has a folder");
    let mut broken = Vec::new();
    for (number, line) in prose_lines(&text) {
        for target in link_targets(line) {
            if target.contains("://") || target.starts_with("mailto:") {
                continue;
            }
            let (path, fragment) = match target.split_once('#') {
                Some((path, fragment)) => (path, Some(fragment)),
                None => (target.as_str(), None),
            };
            let linked = if path.is_empty() {
                file.to_path_buf()
            } else {
                dir.join(path)
            };
            let why = if !linked.exists() {
                Some("no such file".to_string())
            } else if let Some(fragment) = fragment {
                let linked_text = fs::read_to_string(&linked).expect("a linked file is readable");
                (!anchors(&linked_text).contains(fragment))
                    .then(|| format!("no heading with anchor #{fragment}"))
            } else {
                None
            };
            if let Some(why) = why {
                broken.push(format!("{}:{number}: {target} ({why})", file.display()));
            }
        }
    }
    broken
}

#[test]
fn every_relative_link_in_the_readme_and_docs_resolves() {
    let broken: Vec<String> = markdown_files()
        .iter()
        .flat_map(|file| broken_links(file))
        .collect();
    assert!(broken.is_empty(), "broken links:\n{}", broken.join("\n"));
}

#[test]
fn the_readme_stays_under_its_line_limit() {
    let text = fs::read_to_string(root().join("README.md")).expect("README.md is readable");
    let lines = text.lines().count();
    assert!(
        lines < README_MAX_LINES,
        "README.md has {lines} lines, the limit is {README_MAX_LINES}: move detail into docs/"
    );
}

/// The README's *Set up* holds two commands, the quickstart and the suite, and CI runs the
/// suite's exactly as it is written there (issue 34).
#[test]
fn ci_runs_the_readmes_test_command() {
    let readme = fs::read_to_string(root().join("README.md")).expect("README.md is readable");
    let setup = &readme[readme.find("## Set up").expect("a Set up section")..];
    let block = setup.split("```").nth(1).expect("a code block in Set up");
    let commands: Vec<&str> = block
        .lines()
        .skip(1)
        .map(|l| l.split(" #").next().unwrap_or("").trim())
        .filter(|l| !l.is_empty())
        .collect();
    assert_eq!(commands.len(), 2, "two commands in Set up: {commands:?}");
    let ci = fs::read_to_string(root().join(".ci/run")).expect(".ci/run is readable");
    assert!(
        ci.lines().any(|l| l.trim() == commands[1]),
        ".ci/run does not run the README's test command {:?}",
        commands[1]
    );
}

#[test]
fn the_readme_links_every_docs_page() {
    let readme = fs::read_to_string(root().join("README.md")).expect("README.md is readable");
    let linked: HashSet<String> = prose_lines(&readme)
        .into_iter()
        .flat_map(|(_, line)| link_targets(line))
        .map(|target| target.split('#').next().unwrap_or_default().to_string())
        .collect();
    let missing: Vec<String> = markdown_files()
        .iter()
        .skip(1)
        .map(|path| {
            let name = path.file_name().expect("a docs page has a name");
            format!("docs/{}", name.to_string_lossy())
        })
        .filter(|page| !linked.contains(page))
        .collect();
    assert!(
        missing.is_empty(),
        "docs pages the README does not link: {missing:?}"
    );
}

#[test]
fn headings_are_spelled_as_github_anchors_them() {
    assert_eq!(slug("The `leasehold` command"), "the-leasehold-command");
    assert_eq!(slug("`serve`: the dashboard"), "serve-the-dashboard");
    assert_eq!(
        slug("Queues, limits, pauses and dependencies"),
        "queues-limits-pauses-and-dependencies"
    );
    let text = "# A\n```sh\n# not a heading\n```\n## A\n";
    let found = anchors(text);
    assert!(found.contains("a") && found.contains("a-1") && !found.contains("not-a-heading"));
}
