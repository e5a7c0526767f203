//! The output formats of `record` and `report`: chosen by `--format` or the file's name,
//! written to a file or standard output (`-o -`).

use std::path::Path;

use anyhow::{bail, Context, Result};

use crate::encode::{flamegraph, pprof, speedscope};
use crate::proto::Profile;

/// What `record` and `report` write: `--format`, or chosen by the output file's name.
#[derive(Clone, Copy, PartialEq, Eq, Debug, clap::ValueEnum)]
pub enum Format {
    /// pprof, gzipped protobuf (go tool pprof, Pyroscope, Grafana).
    Pprof,
    /// Collapsed stacks, one `a;b;c COUNT` line per stack (flamegraph.pl, inferno).
    Folded,
    /// A flame graph.
    Svg,
    /// speedscope's JSON (<https://www.speedscope.app>).
    Speedscope,
}

/// The format of `path`: `asked`, else folded for `-`, else by its extension.
pub fn format_of(path: &Path, asked: Option<Format>) -> Result<Format> {
    if let Some(f) = asked {
        return Ok(f);
    }
    if path == Path::new("-") {
        return Ok(Format::Folded);
    }
    let name = path.file_name().and_then(|n| n.to_str()).unwrap_or("");
    Ok(if name.ends_with(".pb.gz") || name.ends_with(".pprof") {
        Format::Pprof
    } else if name.ends_with(".folded") {
        Format::Folded
    } else if name.ends_with(".svg") {
        Format::Svg
    } else if name.ends_with(".speedscope.json") || name.ends_with(".speedscope") {
        Format::Speedscope
    } else {
        bail!(
            "{}: say --format, or end the name in .pb.gz, .pprof, .folded, .svg or .speedscope.json",
            path.display()
        )
    })
}

/// `profile` in `format`; `gz` is its gzipped pprof when the caller has it already.
pub fn render(
    profile: &Profile,
    gz: Option<&[u8]>,
    title: &str,
    format: Format,
) -> Result<Vec<u8>> {
    Ok(match format {
        Format::Pprof => match gz {
            Some(gz) => gz.to_vec(),
            None => pprof::to_gzip(profile).context("compressing the profile")?,
        },
        Format::Folded => {
            let mut text = flamegraph::folded(profile).join("\n");
            text.push('\n');
            text.into_bytes()
        }
        Format::Svg => flamegraph::svg(profile, title)?,
        Format::Speedscope => speedscope::speedscope(profile, title),
    })
}

/// Writes `bytes` to `path`, or to standard output for `-`; returns what to call it.
pub fn write(path: &Path, bytes: &[u8]) -> Result<String> {
    if path == Path::new("-") {
        std::io::Write::write_all(&mut std::io::stdout().lock(), bytes)
            .context("writing to standard output")?;
        Ok("standard output".to_owned())
    } else {
        std::fs::write(path, bytes).with_context(|| format!("writing {}", path.display()))?;
        Ok(path.display().to_string())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn formats_come_from_the_flag_then_the_name() {
        let f = |p: &str, a| format_of(Path::new(p), a).ok();
        assert_eq!(f("a.pb.gz", None), Some(Format::Pprof));
        assert_eq!(f("a.pprof", None), Some(Format::Pprof));
        assert_eq!(f("a.folded", None), Some(Format::Folded));
        assert_eq!(f("a.svg", None), Some(Format::Svg));
        assert_eq!(f("a.speedscope.json", None), Some(Format::Speedscope));
        assert_eq!(f("-", None), Some(Format::Folded));
        assert_eq!(f("-", Some(Format::Pprof)), Some(Format::Pprof));
        assert_eq!(f("a.txt", None), None);
    }
}
