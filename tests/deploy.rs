//! What an operator installs, checked (`deploy/README.md`): `kvgate --version` names the commit
//! it was built from (and `build.rs` says `unknown` outside a repository); the systemd unit's
//! command line, expanded with the sample environment file as systemd expands it, is accepted by
//! kvgate's own flag checks; `systemd-analyze verify` and its offline security rating pass on the
//! unit (skipped with a note where `systemd-analyze` is absent); every sysctl key exists and is
//! explained.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Command;

use clap::{CommandFactory, Parser};
use kvgate::config::{Cli, Config};

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

/// `build.rs` compiled alone into `work/build-script`, to run as cargo would.
fn compile_build_script(work: &Path) -> PathBuf {
    let script = work.join("build-script");
    let rustc = std::env::var("RUSTC").unwrap_or_else(|_| "rustc".to_string());
    let status = Command::new(rustc)
        // Without the proto compilation, which needs the build dependencies.
        .args(["--edition", "2021", "--cfg", "kvgate_commit_only", "-o"])
        .arg(&script)
        .arg(repo_root().join("build.rs"))
        .status()
        .expect("run rustc");
    assert!(status.success(), "rustc could not compile build.rs");
    script
}

/// Compiles `build.rs` alone and runs it as cargo would, in a folder with no repository above
/// it: the commit must be `unknown`, and setting `KVGATE_GIT_COMMIT` must win.
#[test]
fn build_script_says_unknown_without_a_repository() {
    let work = std::env::temp_dir().join(format!("kvgate-build-rs-{}", std::process::id()));
    let crate_dir = work.join("crate");
    std::fs::create_dir_all(&crate_dir).expect("create a scratch folder");
    let script = compile_build_script(&work);
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

/// In a fresh clone the branch lives in `packed-refs` only, and a commit writes the branch's own
/// file: the build script must name the commit and watch the folder where that file will appear.
#[test]
fn build_script_follows_a_packed_branch() {
    if git(&["--version"]).is_none() {
        eprintln!("SKIPPED: no git here");
        return;
    }
    let work = std::env::temp_dir().join(format!("kvgate-build-rs-packed-{}", std::process::id()));
    let clone = work.join("clone");
    std::fs::create_dir_all(&clone).expect("create a scratch folder");
    let script = compile_build_script(&work);
    let in_clone = |args: &[&str]| -> String {
        let output = Command::new("git")
            .args([
                "-c",
                "user.name=t",
                "-c",
                "user.email=t@t",
                "-c",
                "init.defaultBranch=main",
            ])
            .args(args)
            .current_dir(&clone)
            .output()
            .expect("run git");
        assert!(output.status.success(), "git {args:?} failed");
        String::from_utf8_lossy(&output.stdout).trim().to_string()
    };
    in_clone(&["init", "-q"]);
    in_clone(&["commit", "-q", "--allow-empty", "-m", "one"]);
    in_clone(&["pack-refs", "--all"]);
    let head = in_clone(&["rev-parse", "--short=12", "HEAD"]);
    let output = Command::new(&script)
        .env("CARGO_MANIFEST_DIR", &clone)
        .env_remove("KVGATE_GIT_COMMIT")
        .current_dir(&clone)
        .output()
        .expect("run the build script");
    let printed = String::from_utf8_lossy(&output.stdout).into_owned();
    std::fs::remove_dir_all(&work).ok();
    assert!(
        printed.contains(&format!("cargo:rustc-env=KVGATE_GIT_COMMIT={head}\n")),
        "the build script did not name {head}:\n{printed}"
    );
    assert!(
        printed.contains("cargo:rerun-if-changed=.git/refs/heads\n"),
        "a packed branch's folder is not watched:\n{printed}"
    );
}

fn deploy_file(name: &str) -> String {
    let path = repo_root().join("deploy").join(name);
    std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("read {}: {e}", path.display()))
}

/// `KEY=VALUE` lines of an environment file (comments and blank lines skipped).
fn env_file(text: &str) -> BTreeMap<String, String> {
    text.lines()
        .map(str::trim)
        .filter(|line| !line.is_empty() && !line.starts_with('#'))
        .map(|line| {
            let (key, value) = line
                .split_once('=')
                .unwrap_or_else(|| panic!("kvgate.env: {line:?} is not KEY=VALUE"));
            (key.to_string(), value.to_string())
        })
        .collect()
}

/// The unit's `ExecStart` as systemd runs it: a word that is exactly `$VAR` becomes the value's
/// whitespace-separated words (none when empty), `${VAR}` is replaced inside its word.
fn exec_start_argv(unit: &str, env: &BTreeMap<String, String>) -> Vec<String> {
    let line = unit
        .lines()
        .find_map(|line| line.strip_prefix("ExecStart="))
        .expect("kvgate.service has an ExecStart= line");
    let lookup = |name: &str| -> &str {
        env.get(name)
            .unwrap_or_else(|| panic!("ExecStart uses ${name}, which kvgate.env does not set"))
    };
    let mut argv = Vec::new();
    for word in line.split_whitespace() {
        if let Some(name) = word.strip_prefix('$').filter(|n| !n.starts_with('{')) {
            argv.extend(lookup(name).split_whitespace().map(str::to_string));
            continue;
        }
        let mut expanded = String::new();
        let mut rest = word;
        while let Some(start) = rest.find("${") {
            let end = rest[start..]
                .find('}')
                .unwrap_or_else(|| panic!("unclosed ${{ in {word:?}"));
            expanded.push_str(&rest[..start]);
            expanded.push_str(lookup(&rest[start + 2..start + end]));
            rest = &rest[start + end + 1..];
        }
        expanded.push_str(rest);
        argv.push(expanded);
    }
    argv
}

#[test]
fn unit_command_line_with_the_sample_env_is_valid_kvgate_flags() {
    let env = env_file(&deploy_file("kvgate.env"));
    let argv = exec_start_argv(&deploy_file("kvgate.service"), &env);
    assert_eq!(
        argv[0], "/usr/local/bin/kvgate",
        "the unit runs the installed binary"
    );
    assert!(
        argv.iter().any(|a| a == "--worker-urls") && argv.iter().any(|a| a.starts_with("http://")),
        "the sample names workers: {argv:?}"
    );
    let cli = Cli::try_parse_from(&argv)
        .unwrap_or_else(|e| panic!("kvgate rejects the unit's command line {argv:?}:\n{e}"));
    let config = Config::from_cli(&cli)
        .unwrap_or_else(|e| panic!("kvgate rejects the unit's command line {argv:?}: {e}"));
    assert_eq!(config.workers.len(), 2, "the sample env names two workers");
    assert_eq!(config.listen_addr.port(), 30000);
}

#[test]
fn every_flag_named_in_the_deploy_files_exists() {
    let mut command = Cli::command();
    command.build();
    let longs: Vec<String> = command
        .get_arguments()
        .filter_map(|arg| arg.get_long().map(|long| format!("--{long}")))
        .collect();
    for name in ["kvgate.env", "kvgate.service"] {
        let text = deploy_file(name);
        let mentioned = text
            .split(|c: char| !(c.is_ascii_alphanumeric() || c == '-'))
            .filter(|word| {
                word.strip_prefix("--")
                    .is_some_and(|rest| rest.starts_with(|c: char| c.is_ascii_lowercase()))
            });
        for flag in mentioned {
            // Options of the other commands the unit's install notes cite (sysctl, systemctl).
            if ["--system", "--now"].contains(&flag) {
                continue;
            }
            assert!(
                longs.iter().any(|long| long == flag),
                "deploy/{name} names {flag}, which `kvgate --help` does not list"
            );
        }
    }
}

/// The unit with its binary path pointed at the freshly built kvgate (`verify` checks that the
/// command exists), in a scratch folder.
fn unit_for_systemd_analyze() -> (PathBuf, PathBuf) {
    let dir = std::env::temp_dir().join(format!("kvgate-unit-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("create a scratch folder");
    let kvgate = utils::process::workspace_bin("kvgate");
    let unit = deploy_file("kvgate.service").replace(
        "/usr/local/bin/kvgate",
        kvgate.to_str().expect("a UTF-8 target path"),
    );
    let path = dir.join("kvgate.service");
    std::fs::write(&path, unit).expect("write the unit");
    (dir, path)
}

fn systemd_analyze(args: &[&str], unit: &Path) -> Option<std::process::Output> {
    match Command::new("systemd-analyze")
        .args(args)
        .arg(unit)
        .output()
    {
        Ok(output) => Some(output),
        Err(e) => {
            eprintln!(
                "SKIPPED: systemd-analyze cannot run here ({e}); install the Debian package \
                 `systemd` to check deploy/kvgate.service"
            );
            None
        }
    }
}

#[test]
fn unit_passes_systemd_analyze_verify_and_its_security_rating() {
    let (dir, unit) = unit_for_systemd_analyze();
    let Some(verify) = systemd_analyze(&["verify"], &unit) else {
        return;
    };
    let complaints = String::from_utf8_lossy(&verify.stderr).into_owned();
    // The checker is sensitive: the same unit with an unknown key draws a complaint.
    let broken = dir.join("kvgate-broken.service");
    let text = std::fs::read_to_string(&unit).expect("read the unit back");
    std::fs::write(&broken, text.replace("[Service]", "[Service]\nNoSuchKey=1")).expect("write");
    let broken_verify = systemd_analyze(&["verify"], &broken).expect("ran once already");
    let security = systemd_analyze(&["security", "--offline=true", "--threshold=20"], &unit)
        .expect("ran once already");
    std::fs::remove_dir_all(&dir).ok();
    assert!(
        verify.status.success() && complaints.trim().is_empty(),
        "systemd-analyze verify deploy/kvgate.service:\n{complaints}"
    );
    assert!(
        String::from_utf8_lossy(&broken_verify.stderr).contains("NoSuchKey"),
        "systemd-analyze verify did not flag an unknown key; the check above proves nothing"
    );
    let report = String::from_utf8_lossy(&security.stdout);
    let errors = String::from_utf8_lossy(&security.stderr);
    if errors.contains("--offline") || errors.contains("unrecognized option") {
        eprintln!("SKIPPED security rating: this systemd-analyze has no --offline ({errors})");
        return;
    }
    let overall = report
        .lines()
        .find(|line| line.contains("Overall exposure level"))
        .unwrap_or("(no overall line)");
    assert!(
        security.status.success(),
        "systemd-analyze security rates the unit above 2.0: {overall}\n{errors}"
    );
}

#[test]
fn sysctl_settings_exist_and_are_explained() {
    let conf = deploy_file("sysctl.d/90-kvgate.conf");
    let readme = deploy_file("README.md");
    let mut previous_is_comment = false;
    let mut keys = 0;
    for line in conf.lines().map(str::trim) {
        if line.is_empty() {
            previous_is_comment = false;
            continue;
        }
        if line.starts_with('#') {
            previous_is_comment = true;
            continue;
        }
        let (key, value) = line
            .split_once('=')
            .unwrap_or_else(|| panic!("90-kvgate.conf: {line:?} is not `key = value`"));
        let (key, value) = (key.trim(), value.trim());
        keys += 1;
        assert!(
            previous_is_comment,
            "90-kvgate.conf: {key} has no comment above it"
        );
        assert!(!value.is_empty(), "90-kvgate.conf: {key} has no value");
        assert!(
            readme.contains(&format!("`{key}`")),
            "deploy/README.md does not explain {key}"
        );
        let proc_path = Path::new("/proc/sys").join(key.replace('.', "/"));
        if Path::new("/proc/sys/net").exists() {
            assert!(
                proc_path.exists(),
                "90-kvgate.conf: {key} does not exist in this kernel"
            );
        }
    }
    assert!(keys >= 5, "90-kvgate.conf holds only {keys} settings");
}

/// The arguments after `smg launch` in a command line from SMG's documentation.
fn smg_launch_args(line: &str) -> Vec<String> {
    let words: Vec<&str> = line.split_whitespace().collect();
    assert_eq!(words[..2], ["smg", "launch"], "{line}");
    std::iter::once("kvgate")
        .chain(words[2..].iter().copied())
        .map(str::to_string)
        .collect()
}

fn accepted(argv: &[String]) -> Config {
    let cli = Cli::try_parse_from(argv).unwrap_or_else(|e| panic!("{argv:?}:\n{e}"));
    Config::from_cli(&cli).unwrap_or_else(|e| panic!("{argv:?}: {e}"))
}

/// SMG's drop-in check: command lines from SMG's README (`smg launch ...`, its "Run" section)
/// and from the cache-aware routing reference's hash-index example are kvgate's flags. Host
/// names resolve at start, and the documentation's `gpu1`/`gpu2` do not resolve here: those,
/// and nothing else, are replaced by documentation addresses (192.0.2.1, 192.0.2.2) before
/// validation (clap parses the line as
/// written).
#[test]
fn smgs_documented_command_lines_are_kvgate_command_lines() {
    // README: a single worker, unchanged.
    let single = accepted(&smg_launch_args(
        "smg launch --worker-urls http://localhost:8000",
    ));
    assert_eq!(single.workers.len(), 1);
    let resolvable = |argv: Vec<String>| -> Vec<String> {
        Cli::try_parse_from(&argv).unwrap_or_else(|e| panic!("{argv:?}:\n{e}"));
        argv.into_iter()
            .map(|a| {
                a.replace("//gpu1:", "//192.0.2.1:")
                    .replace("//gpu2:", "//192.0.2.2:")
            })
            .collect()
    };
    // README: cache-aware routing over two workers (the tree index).
    let cache_aware = accepted(&resolvable(smg_launch_args(
        "smg launch --worker-urls http://gpu1:8000 http://gpu2:8000 --policy cache_aware",
    )));
    assert_eq!(cache_aware.workers.len(), 2);
    assert_eq!(
        cache_aware.policy.kind,
        kvgate::config::PolicyKind::CacheAware
    );
    assert_eq!(
        cache_aware.policy.cache_index,
        kvgate::policy::CacheIndexKind::Tree
    );
    // README: the high-availability mesh.
    let mesh = accepted(&resolvable(smg_launch_args(
        "smg launch --worker-urls http://gpu1:8000 --enable-mesh \
         --mesh-advertise-host 10.0.0.1 --mesh-peer-urls 10.0.0.2:39527",
    )));
    let mesh = mesh.mesh.expect("the mesh is on");
    assert_eq!(mesh.advertise_addr, "10.0.0.1:39527".parse().unwrap());
    assert_eq!(mesh.peers, ["10.0.0.2:39527".parse().unwrap()]);
    // The cache-aware reference's hash index. Its workers are gRPC (their names replaced by
    // documentation addresses, as above) and its --model-path a hub id: kvgate takes the gRPC
    // workers, reads tokenizers from local files only, and says so.
    let hash_line = "smg launch --policy cache_aware --cache-index hash \
        --cache-boundaries 2048,8192,32768 --cache-ttl-secs 180 \
        --worker-urls grpc://worker-1:50051 grpc://worker-2:50051 \
        --model-path meta-llama/Llama-3.1-8B-Instruct";
    let argv: Vec<String> = smg_launch_args(hash_line)
        .into_iter()
        .map(|a| {
            a.replace("//worker-1:", "//192.0.2.1:")
                .replace("//worker-2:", "//192.0.2.2:")
        })
        .collect();
    let cli = Cli::try_parse_from(&argv).unwrap_or_else(|e| panic!("{argv:?}:\n{e}"));
    let refused = Config::from_cli(&cli).unwrap_err().to_string();
    assert!(refused.contains("--model-path"), "{refused}");
    let model = argv.iter().position(|a| a == "--model-path").expect("flag");
    let grpc_workers = accepted(&[&argv[..model], &argv[model + 2..]].concat());
    assert!(grpc_workers
        .workers
        .iter()
        .all(|w| w.url.starts_with("grpc://")));
    // The same line with HTTP workers and the model's tokenizer on disk is accepted as is.
    let tokenizer_dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("target/tokenizers/llama3");
    let mut argv: Vec<String> = resolvable(smg_launch_args(
        &hash_line
            .replace("grpc://worker-1:50051", "http://gpu1:50051")
            .replace("grpc://worker-2:50051", "http://gpu2:50051"),
    ));
    if tokenizer_dir.join("tokenizer.json").is_file() {
        let model = argv
            .iter()
            .position(|a| a == "meta-llama/Llama-3.1-8B-Instruct")
            .expect("the model path");
        argv[model] = format!(
            "meta-llama/Llama-3.1-8B-Instruct={}",
            tokenizer_dir.display()
        );
    } else {
        eprintln!(
            "no tokenizer fixture (scripts/fetch-tokenizers.sh): hash mode checked without one"
        );
        let model = argv.iter().position(|a| a == "--model-path").expect("flag");
        argv.drain(model..model + 2);
    }
    let hash = accepted(&argv);
    assert_eq!(
        hash.policy.cache_index,
        kvgate::policy::CacheIndexKind::Hash
    );
    assert_eq!(hash.policy.cache_boundaries, [2048, 8192, 32768]);
    assert_eq!(hash.policy.cache_ttl, std::time::Duration::from_secs(180));
    if tokenizer_dir.join("tokenizer.json").is_file() {
        let tokenizers = &hash.tokenizers;
        assert!(tokenizers
            .for_model("meta-llama/Llama-3.1-8B-Instruct")
            .is_some());
    }
}
