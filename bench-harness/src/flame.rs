//! Flame graphs of a profiled kvgate (`scripts/flamegraph.sh`): the text of `perf script`
//! collapsed into folded stacks ([`collapse_perf_script`]), the stacks drawn as an SVG
//! ([`render_svg`]), and the widest frames of the process's own code ([`widest_frames`]), which
//! `flamegraphs/README.md` lists for each graph. Collapsing and drawing are `inferno`'s (the Rust
//! port of Brendan Gregg's FlameGraph scripts); errors are `io::Error`s with what failed.

use std::collections::{HashMap, HashSet};
use std::io;

use inferno::collapse::perf::{Folder, Options as CollapseOptions};
use inferno::collapse::Collapse;
use inferno::flamegraph::color::MultiPalette;
use inferno::flamegraph::{self, Options as GraphOptions, Palette};

/// The folded stacks (`root;caller;callee WEIGHT`, one line per distinct stack) of `perf script`
/// output. The root frame of each stack is the thread's name (`kvgate-data-0`, ...). A stack's
/// weight is the sum of its samples' periods: nanoseconds of CPU for the `cpu-clock` event.
pub fn collapse_perf_script(perf_script: &[u8]) -> io::Result<String> {
    let mut options = CollapseOptions::default();
    options.nthreads = 1;
    let mut folded = Vec::new();
    Folder::from(options).collapse(perf_script, &mut folded)?;
    String::from_utf8(folded).map_err(|e| io::Error::new(io::ErrorKind::InvalidData, e))
}

/// The SVG flame graph of `folded` stacks, titled `title` with `subtitle` under it; `unit` names
/// the weights in the tooltips (`ns` for `cpu-clock`).
pub fn render_svg(folded: &str, title: &str, subtitle: &str, unit: &str) -> io::Result<Vec<u8>> {
    let mut options = GraphOptions::default();
    options.title = title.to_string();
    options.subtitle = Some(subtitle.to_string());
    options.colors = Palette::Multi(MultiPalette::Rust);
    options.count_name = unit.to_string();
    let mut svg = Vec::new();
    flamegraph::from_lines(&mut options, folded.lines(), &mut svg)?;
    Ok(svg)
}

/// One frame's width: the weight of the stacks that hold it, and its share of the whole graph.
#[derive(Clone, Debug, PartialEq)]
pub struct FrameWidth {
    /// The function, without the `::{{closure}}` suffixes of async bodies.
    pub name: String,
    /// The weight of the stacks with this frame anywhere on them (counted once per stack).
    pub weight: u64,
    /// `weight` over the whole graph's weight, 0 to 1.
    pub share: f64,
}

/// Which frames [`widest_frames`] ranks: names containing `include`, except those containing any
/// of `exclude` (scaffolding every sample passes through, such as the thread entry points).
#[derive(Clone, Debug)]
pub struct FrameFilter<'a> {
    /// A frame is ranked only if its name contains this (`kvgate::`: the gateway's own code).
    pub include: &'a str,
    /// A frame whose name contains one of these is skipped.
    pub exclude: &'a [&'a str],
}

/// The `count` widest frames of `folded` stacks that pass `filter`, widest first (ties by name),
/// and the graph's total weight. Lines that are not `stack COUNT` are an error.
pub fn widest_frames(
    folded: &str,
    filter: &FrameFilter<'_>,
    count: usize,
) -> io::Result<(Vec<FrameWidth>, u64)> {
    let mut widths: HashMap<&str, u64> = HashMap::new();
    let mut total = 0u64;
    for line in folded.lines().filter(|line| !line.trim().is_empty()) {
        let (stack, weight) = line
            .rsplit_once(' ')
            .and_then(|(stack, n)| Some((stack, n.trim().parse::<u64>().ok()?)))
            .ok_or_else(|| {
                io::Error::new(
                    io::ErrorKind::InvalidData,
                    format!("not a folded stack line: {line:?}"),
                )
            })?;
        total += weight;
        let mut seen = HashSet::new();
        for frame in stack.split(';').map(without_closures) {
            let ranked = frame.contains(filter.include)
                && !filter.exclude.iter().any(|skip| frame.contains(skip));
            if ranked && seen.insert(frame) {
                *widths.entry(frame).or_default() += weight;
            }
        }
    }
    let mut frames: Vec<FrameWidth> = widths
        .into_iter()
        .map(|(name, weight)| FrameWidth {
            name: name.to_string(),
            weight,
            share: if total == 0 {
                0.0
            } else {
                weight as f64 / total as f64
            },
        })
        .collect();
    frames.sort_by(|a, b| b.weight.cmp(&a.weight).then_with(|| a.name.cmp(&b.name)));
    frames.truncate(count);
    Ok((frames, total))
}

/// `f::{{closure}}::{{closure}}` → `f`: an async fn's body is polled as its closure.
fn without_closures(frame: &str) -> &str {
    let mut name = frame;
    while let Some(stripped) = name.strip_suffix("::{{closure}}") {
        name = stripped;
    }
    name
}

#[cfg(test)]
mod tests {
    use super::*;

    const KVGATE: FrameFilter<'static> = FrameFilter {
        include: "kvgate::",
        exclude: &["kvgate::runtime::"],
    };

    #[test]
    fn widest_frames_count_each_frame_once_per_stack_and_skip_excluded_ones() {
        let folded = "\
kvgate-data-0;kvgate::runtime::run_data_core;kvgate::http::server::serve_connection::{{closure}};kvgate::http::proxy::proxy_request::{{closure}};memcpy 6
kvgate-data-0;kvgate::runtime::run_data_core;kvgate::http::server::serve_connection::{{closure}};kvgate::http::server::serve_connection::{{closure}};read 3
kvgate-control;kvgate::control::ControlCore::drain_records;kvgate::index::IndexWriter::insert_text_shared 1
";
        let (frames, total) = widest_frames(folded, &KVGATE, 3).expect("valid folded stacks");
        assert_eq!(total, 10);
        let names: Vec<(&str, u64)> = frames.iter().map(|f| (f.name.as_str(), f.weight)).collect();
        assert_eq!(
            names,
            [
                ("kvgate::http::server::serve_connection", 9),
                ("kvgate::http::proxy::proxy_request", 6),
                ("kvgate::control::ControlCore::drain_records", 1),
            ]
        );
        assert!((frames[0].share - 0.9).abs() < 1e-9);
    }

    #[test]
    fn a_line_without_a_count_is_an_error() {
        let error = widest_frames("a;b;c\n", &KVGATE, 3).expect_err("no count");
        assert_eq!(error.kind(), io::ErrorKind::InvalidData);
    }

    #[test]
    fn perf_script_text_collapses_and_renders_with_its_frames() {
        let perf_script = "\
kvgate-data-0  4242/4243  1000.000001:     1001001 cpu-clock:
\t    55d0c0de1000 kvgate::http::proxy::proxy_request::{{closure}}+0x10 (/usr/local/bin/kvgate)
\t    55d0c0de2000 kvgate::http::server::serve_connection::{{closure}}+0x20 (/usr/local/bin/kvgate)
\t    7f0000001000 start_thread+0x30 (/usr/lib/libc.so.6)

kvgate-data-0  4242/4243  1000.001002:     1001001 cpu-clock:
\t    55d0c0de2000 kvgate::http::server::serve_connection::{{closure}}+0x20 (/usr/local/bin/kvgate)
\t    7f0000001000 start_thread+0x30 (/usr/lib/libc.so.6)

";
        let folded = collapse_perf_script(perf_script.as_bytes()).expect("collapse");
        assert!(
            folded.contains("kvgate-data-0;start_thread;kvgate::http::server::serve_connection::{{closure}};kvgate::http::proxy::proxy_request::{{closure}} 1"),
            "{folded}"
        );
        let (frames, total) = widest_frames(&folded, &KVGATE, 3).expect("valid folded stacks");
        // Weighted by the period: two samples of 1,001,001 ns of CPU each.
        assert_eq!(total, 2_002_002);
        assert_eq!(frames[0].name, "kvgate::http::server::serve_connection");
        assert_eq!(frames[0].weight, 2_002_002);
        assert_eq!(frames[1].weight, 1_001_001);
        let svg = render_svg(&folded, "kvgate: test", "commit abc", "ns").expect("render");
        let svg = String::from_utf8(svg).expect("UTF-8 SVG");
        assert!(svg.starts_with("<?xml"), "{}", &svg[..svg.len().min(200)]);
        assert!(svg.contains("kvgate::http::proxy::proxy_request"));
        assert!(svg.contains("kvgate: test"));
    }
}
