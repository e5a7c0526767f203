//! `docs/configuration.md`, generated from `config/ember.yaml`: every key, its default and
//! the comment above it, so the reference cannot drift from the file `ember run` embeds.
//! `ember docs config` prints it; a test fails when the checked-in page differs.
//!
//! The YAML is read as text, not parsed: the comments are the documentation, and a YAML
//! parser drops them. The file's shape is simple and fixed (two-space indents, `key: value`
//! on one line, a comment block right above the key it documents), and the test keeps it so.

use std::fmt::Write as _;

use super::DEFAULT_YAML;

/// One key of the file: its dotted path, its default as written, the comment above it.
#[derive(Debug, PartialEq, Eq)]
struct Key {
    path: String,
    default: String,
    comment: String,
}

/// A section (`sampling`, `sinks.pyroscope`): its comment and its leaf keys, in file order.
#[derive(Debug, Default)]
struct Section {
    path: String,
    comment: String,
    keys: Vec<Key>,
}

/// The file's opening comment and its sections, in file order.
fn sections(yaml: &str) -> (String, Vec<Section>) {
    let mut intro = String::new();
    let mut pending: Vec<&str> = Vec::new();
    let mut stack: Vec<(usize, &str)> = Vec::new();
    let mut out: Vec<Section> = Vec::new();
    for line in yaml.lines() {
        let trimmed = line.trim_start();
        let indent = line.len() - trimmed.len();
        if trimmed.is_empty() {
            // The opening comment ends at the first blank line before any key.
            if out.is_empty() && intro.is_empty() && !pending.is_empty() {
                intro = join(&pending);
                pending.clear();
            }
            continue;
        }
        if let Some(text) = trimmed.strip_prefix('#') {
            pending.push(text.strip_prefix(' ').unwrap_or(text));
            continue;
        }
        let Some((name, value)) = trimmed.split_once(':') else {
            continue;
        };
        while stack.last().is_some_and(|&(i, _)| i >= indent) {
            stack.pop();
        }
        let mut path: Vec<&str> = stack.iter().map(|&(_, n)| n).collect();
        path.push(name);
        let value = value.trim();
        if value.is_empty() {
            stack.push((indent, name));
            out.push(Section {
                path: path.join("."),
                comment: join(&pending),
                keys: Vec::new(),
            });
        } else if let Some(section) = {
            // A key after a nested section belongs to the section above it again.
            let parent = path[..path.len() - 1].join(".");
            out.iter_mut().rev().find(|s| s.path == parent)
        } {
            // A section's first comment may open with the section's own text, ended by an
            // empty `#` line; the rest is the key's.
            let mut comment = &pending[..];
            if section.keys.is_empty() && section.comment.is_empty() {
                if let Some(blank) = pending.iter().position(|l| l.trim().is_empty()) {
                    section.comment = join(&pending[..blank]);
                    comment = &pending[blank + 1..];
                }
            }
            section.keys.push(Key {
                path: path.join("."),
                default: value.to_owned(),
                comment: join(comment),
            });
        }
        pending.clear();
    }
    (intro, out)
}

/// Comment lines as one paragraph.
fn join(lines: &[&str]) -> String {
    lines
        .iter()
        .map(|l| l.trim())
        .filter(|l| !l.is_empty())
        .collect::<Vec<_>>()
        .join(" ")
}

/// Text made safe for a Markdown table cell: `|` ends a cell and `<word>` is taken for an
/// HTML tag (and hidden) by GitHub.
pub(crate) fn cell(text: &str) -> String {
    text.replace('|', "\\|").replace('<', "&lt;")
}

/// The page, as `docs/configuration.md` holds it.
pub fn markdown() -> String {
    let (intro, sections) = sections(DEFAULT_YAML);
    let mut out = String::new();
    out.push_str(
        "<!-- Generated from config/ember.yaml by `ember docs config`; do not edit: edit the \
         YAML's comments and run `make docs`. -->\n\n# Configuration\n\n",
    );
    out.push_str(&intro);
    out.push_str(
        "\n\nThe file: [config/ember.yaml](../config/ember.yaml). Unknown keys are errors; \
         `ember check-config FILE` names the line and column of a mistake. Sizes are bytes.\n",
    );
    for s in &sections {
        let level = if s.path.contains('.') { "###" } else { "##" };
        let _ = writeln!(out, "\n{level} `{}`", s.path);
        if !s.comment.is_empty() {
            let _ = writeln!(out, "\n{}", cell(&s.comment));
        }
        if s.keys.is_empty() {
            continue;
        }
        out.push_str("\n| key | default | meaning |\n|---|---|---|\n");
        for k in &s.keys {
            // Keys written as a pair under one comment (include_x, exclude_x) share it.
            let meaning = if k.comment.is_empty() {
                "(as the key above)".to_owned()
            } else {
                cell(&k.comment)
            };
            let _ = writeln!(
                out,
                "| `{}` | `{}` | {meaning} |",
                k.path,
                k.default.replace('|', "\\|"),
            );
        }
    }
    out
}

/// Fails when the checked-in page `rel` (from the repository root) is not `generated`,
/// naming the first line that differs and the command that writes it again;
/// `EMBER_BLESS=1` writes it instead (as the metrics golden test does).
#[cfg(test)]
pub(crate) fn compare_with_checked_in(rel: &str, generated: &str) {
    let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("..")
        .join(rel);
    if std::env::var_os("EMBER_BLESS").is_some() {
        std::fs::write(&path, generated).expect("writing the page");
        return;
    }
    let on_disk = std::fs::read_to_string(&path).unwrap_or_default();
    if on_disk == generated {
        return;
    }
    let line = on_disk
        .lines()
        .zip(generated.lines())
        .position(|(a, b)| a != b)
        .unwrap_or_else(|| on_disk.lines().count().min(generated.lines().count()));
    panic!(
        "{rel} differs from what it is generated from (first at line {}):\n  on disk:   {:?}\n  \
         generated: {:?}\nregenerate it with `make docs` (target/release/ember docs --out docs)",
        line + 1,
        on_disk.lines().nth(line).unwrap_or("<end of file>"),
        generated.lines().nth(line).unwrap_or("<end of file>"),
    );
}

#[cfg(test)]
mod tests {
    use super::*;

    const SAMPLE: &str = "# Intro line one,\n# and two.\n\na:\n  # The x.\n  x: 1\n  b:\n    \
                          # Why y.\n    y: \"p|q\"\n  # Back up.\n  z: [u]\nc:\n  # All of c.\n  \
                          #\n  # The w.\n  w: {}\n";

    #[test]
    fn keys_take_the_comment_above_them_and_their_dotted_path() {
        let (intro, s) = sections(SAMPLE);
        assert_eq!(intro, "Intro line one, and two.");
        let paths: Vec<_> = s.iter().map(|s| s.path.as_str()).collect();
        assert_eq!(paths, ["a", "a.b", "c"]);
        assert_eq!(
            s[1].keys,
            [Key {
                path: "a.b.y".into(),
                default: "\"p|q\"".into(),
                comment: "Why y.".into()
            }]
        );
        let a: Vec<_> = s[0]
            .keys
            .iter()
            .map(|k| (k.path.as_str(), k.comment.as_str()))
            .collect();
        assert_eq!(a, [("a.x", "The x."), ("a.z", "Back up.")]);
        assert_eq!(s[2].keys[0].default, "{}");
        assert_eq!(
            (s[2].comment.as_str(), s[2].keys[0].comment.as_str()),
            ("All of c.", "The w.")
        );
    }

    /// Every key the agent reads is in the page (the three `interpreters.python.*` keys
    /// were once missing from the hand-written table).
    #[test]
    fn the_page_lists_every_key_of_the_default_file() {
        let page = markdown();
        for key in [
            "sampling.frequency_hz",
            "interpreters.python.enabled",
            "interpreters.python.keep_eval_frames",
            "interpreters.python.cache_bytes",
            "sinks.pyroscope.max_series",
            "server.health_listen",
            "health.stall_windows",
        ] {
            assert!(page.contains(&format!("| `{key}` |")), "{key} missing");
        }
    }

    /// docs/configuration.md is what `ember docs config` prints today.
    #[test]
    fn the_checked_in_page_is_current() {
        compare_with_checked_in("docs/configuration.md", &markdown());
    }
}
