//! Runs routing-input extraction (`request::extract`) a fixed number of times on one of
//! `perf/extract.rs`'s bodies, for instruction counts that a busy host does not move:
//! `scripts/count-extract.sh` runs it under `valgrind --tool=callgrind` at two counts and
//! prints the difference per extraction (issue 21: where the wall-clock spread hides an effect).
//!
//! Usage: `extract_count BODY COUNT`, BODY one of `perf/extract.rs`'s body names
//! (`chat_small`, `chat_36k`, `chat_8192_tokens`, `chat_8192_tokens_newlines`,
//! `generate_8192_ids`, ...); `extract_count --list` prints the names.

use std::hint::black_box;

use kvgate::request::{extract, RoutingHeaders, RoutingInput};

#[path = "extract.rs"]
#[allow(dead_code)]
mod bench;

fn main() {
    let mut args = std::env::args().skip(1);
    let name = args.next().unwrap_or_default();
    let bodies = bench::bodies(&bench::Sizes::full());
    if name == "--list" {
        bodies
            .iter()
            .for_each(|(body_name, ..)| println!("{body_name}"));
        return;
    }
    let Some(count) = args.next().and_then(|count| count.parse::<usize>().ok()) else {
        eprintln!("usage: extract_count BODY COUNT");
        std::process::exit(2);
    };
    let Some((_, endpoint, body)) = bodies.iter().find(|(body_name, ..)| *body_name == name) else {
        let names: Vec<&str> = bodies
            .iter()
            .map(|(body_name, ..)| body_name.as_str())
            .collect();
        eprintln!(
            "extract_count: no body {name:?}; the bodies: {}",
            names.join(" ")
        );
        std::process::exit(2);
    };
    let mut input = RoutingInput::new();
    let mut checksum = 0usize;
    for _ in 0..count {
        let read = extract(
            *endpoint,
            black_box(body),
            RoutingHeaders::default(),
            &mut input,
        );
        checksum += usize::from(read.is_ok()) + input.text().len();
    }
    println!("{name}: {count} extractions, checksum {checksum}");
}
