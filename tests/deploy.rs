//! What an operator installs, checked: `kvgate --version` names the commit it was built from
//! (and `build.rs` says `unknown` outside a repository).

use std::path::PathBuf;
use std::process::Command;

mod utils;

fn repo_root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// The trimmed stdout of `git ARGS` in the repository, or `None` without git or a repository.
fn git(args: &[&str]) -> Option<String> {
    let output = Command::new("git")
        .args(args)
        .current_dir(repo_root())
        .output()
        .ok()?;
    output
        .status
        .success()
        .then(|| String::from_utf8_lossy(&output.stdout).trim().to_string())
}

#[test]
fn version_names_the_package_version_and_the_commit() {
    let output = Command::new(utils::process::workspace_bin("kvgate"))
        .arg("--version")
        .output()
        .expect("run kvgate --version");
    assert!(output.status.success(), "kvgate --version failed");
    let line = String::from_utf8_lossy(&output.stdout).trim().to_string();
    let prefix = format!("kvgate {} (commit ", env!("CARGO_PKG_VERSION"));
    let commit = line
        .strip_prefix(&prefix)
        .and_then(|rest| rest.strip_suffix(')'))
        .unwrap_or_else(|| panic!("{line:?} is not `{prefix}COMMIT)`"));
    match git(&["rev-parse", "HEAD"]) {
        // The binary may predate the last commit only when it was not rebuilt since; the build
        // script reruns on every move of HEAD, so a fresh build names HEAD itself.
        Some(head) => assert!(
            commit.len() == 12 && head.starts_with(commit),
            "kvgate --version says commit {commit:?}, HEAD is {head} (rebuild: cargo build --workspace --bins)"
        ),
        None => assert_eq!(commit, "unknown", "no repository here, yet a commit was printed"),
    }
}

/// Compiles `build.rs` alone and runs it as cargo would, in a folder with no repository above
/// it: the commit must be `unknown`, and setting `KVGATE_GIT_COMMIT` must win.
#[test]
fn build_script_says_unknown_without_a_repository() {
    let work = std::env::temp_dir().join(format!("kvgate-build-rs-{}", std::process::id()));
    let crate_dir = work.join("crate");
    std::fs::create_dir_all(&crate_dir).expect("create a scratch folder");
    let script = work.join("build-script");
    let rustc = std::env::var("RUSTC").unwrap_or_else(|_| "rustc".to_string());
    let status = Command::new(rustc)
        .args(["--edition", "2021", "-o"])
        .arg(&script)
        .arg(repo_root().join("build.rs"))
        .status()
        .expect("run rustc");
    assert!(status.success(), "rustc could not compile build.rs");
    let run = |commit_env: Option<&str>| -> String {
        let mut command = Command::new(&script);
        command
            .env("CARGO_MANIFEST_DIR", &crate_dir)
            .env("GIT_CEILING_DIRECTORIES", &work)
            .env_remove("KVGATE_GIT_COMMIT")
            .current_dir(&crate_dir);
        if let Some(commit) = commit_env {
            command.env("KVGATE_GIT_COMMIT", commit);
        }
        let output = command.output().expect("run the build script");
        assert!(output.status.success(), "the build script failed");
        String::from_utf8_lossy(&output.stdout).into_owned()
    };
    let plain = run(None);
    let packaged = run(Some("abc123"));
    std::fs::remove_dir_all(&work).ok();
    assert!(
        plain.contains("cargo:rustc-env=KVGATE_GIT_COMMIT=unknown\n"),
        "outside a repository the build script printed:\n{plain}"
    );
    assert!(
        !plain.contains("rerun-if-changed=.git") && !plain.contains("/HEAD"),
        "outside a repository no git path may be watched:\n{plain}"
    );
    assert!(
        packaged.contains("cargo:rustc-env=KVGATE_GIT_COMMIT=abc123\n"),
        "KVGATE_GIT_COMMIT did not win:\n{packaged}"
    );
}
