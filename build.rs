//! Build script: records the git commit the binary is built from as `KVGATE_GIT_COMMIT`, which
//! `kvgate --version` prints after the package version.
//!
//! The commit comes from `KVGATE_GIT_COMMIT` in the build's environment when set (a packager
//! building from a tarball), else from `git rev-parse` in the source tree; with neither (no git,
//! no `.git`, not a repository) it is `unknown`, and the build still succeeds. The script reruns
//! when HEAD moves (the HEAD file, the branch's ref, `packed-refs`), so the version follows commits;
//! only paths that exist are watched, since a missing watched path would rerun it on every build.
//!
//! It also compiles `proto/mesh.proto` into prost types (`OUT_DIR/kvgate.mesh.rs`, included by
//! `mesh::wire`) and the gRPC engines' protocols under `proto/smg/` (one file per package,
//! included by `grpc::proto`): `protox` parses the files in Rust, so no `protoc` is needed on
//! the build machine.

use std::path::Path;
use std::process::Command;

fn main() {
    println!("cargo:rerun-if-changed=build.rs");
    println!("cargo:rerun-if-env-changed=KVGATE_GIT_COMMIT");
    let commit = match std::env::var("KVGATE_GIT_COMMIT") {
        Ok(commit) if !commit.trim().is_empty() => commit.trim().to_string(),
        _ => {
            watch_git_head();
            git(&["rev-parse", "--short=12", "HEAD"]).unwrap_or_else(|| "unknown".to_string())
        }
    };
    println!("cargo:rustc-env=KVGATE_GIT_COMMIT={commit}");
    // `tests/deploy.rs` compiles this file alone with rustc (no build dependencies) and
    // `--cfg kvgate_commit_only` to check the commit logic outside a repository.
    #[cfg(not(kvgate_commit_only))]
    compile_protos();
}

/// The `.proto` files under `proto/`: the mesh's messages, and the gRPC engines' protocols
/// (`proto/smg/`, written from SMG's published definitions).
#[cfg(not(kvgate_commit_only))]
const PROTOS: [&str; 4] = [
    "mesh.proto",
    "smg/common.proto",
    "smg/sglang_scheduler.proto",
    "smg/vllm_engine.proto",
];

/// Compiles the protos into prost types, one file per package in `OUT_DIR`; a `.proto` that
/// does not parse fails the build with its error.
#[cfg(not(kvgate_commit_only))]
fn compile_protos() {
    for proto in PROTOS {
        println!("cargo:rerun-if-changed=proto/{proto}");
    }
    let descriptors = match protox::compile(PROTOS, ["proto"]) {
        Ok(descriptors) => descriptors,
        Err(e) => panic!("proto/: {e}"),
    };
    if let Err(e) = prost_build::Config::new().compile_fds(descriptors) {
        panic!("proto/: prost-build: {e}");
    }
}

/// Asks cargo to rerun this script when HEAD or the branch it names changes.
fn watch_git_head() {
    for path in ["HEAD", "packed-refs"] {
        if let Some(file) = git(&["rev-parse", "--git-path", path]) {
            if Path::new(&file).exists() {
                println!("cargo:rerun-if-changed={file}");
            }
        }
    }
    let Some(branch) = git(&["symbolic-ref", "-q", "HEAD"]) else {
        return; // detached: HEAD itself holds the commit
    };
    let Some(file) = git(&["rev-parse", "--git-path", &branch]) else {
        return;
    };
    // A fresh clone keeps its branches in packed-refs only; the first commit then writes the
    // branch's own file. Until it exists, watch the nearest folder that does (cargo scans a
    // watched folder for changes), not the file: a missing path would rerun every build.
    let watched = Path::new(&file).ancestors().find(|path| path.exists());
    if let Some(path) = watched {
        println!("cargo:rerun-if-changed={}", path.display());
    }
}

/// The trimmed stdout of a successful `git ARGS` run in the package's folder, or `None`; also
/// `None` when that folder is not the top of its own repository (a copy of the sources vendored
/// inside another repository must not print that repository's commit).
fn git(args: &[&str]) -> Option<String> {
    let manifest_dir = std::env::var("CARGO_MANIFEST_DIR").ok()?;
    let toplevel = git_in(&manifest_dir, &["rev-parse", "--show-toplevel"])?;
    let same = |a: &str, b: &str| match (Path::new(a).canonicalize(), Path::new(b).canonicalize()) {
        (Ok(a), Ok(b)) => a == b,
        _ => false,
    };
    if !same(&toplevel, &manifest_dir) {
        return None;
    }
    git_in(&manifest_dir, args)
}

/// The trimmed stdout of a successful `git ARGS` run in `dir`, or `None`.
fn git_in(dir: &str, args: &[&str]) -> Option<String> {
    let output = Command::new("git")
        .args(args)
        .current_dir(dir)
        .output()
        .ok()?;
    if !output.status.success() {
        return None;
    }
    let text = String::from_utf8(output.stdout).ok()?;
    let text = text.trim();
    (!text.is_empty()).then(|| text.to_string())
}
