//! `replay`: replays traces or generated workloads through a gateway and reports what happened.
//! See `replay --help`; the work is in `bench_harness::replay`.

use clap::Parser;
use tokio::sync::watch;

use bench_harness::cli::{self, exit_on_error, Threads};
use bench_harness::replay::{cli::Cli, run_cli};

fn main() {
    let cli = Cli::parse();
    let runtime = cli::runtime(Threads::Pool(None));
    let result = runtime.block_on(async {
        let (stop, stopped) = watch::channel(false);
        tokio::spawn(async move {
            wait_for_interrupt().await;
            eprintln!("\nstopping: cancelling requests in flight and stopping children");
            let _ = stop.send(true);
        });
        run_cli(cli, stopped).await
    });
    // Dropping the runtime reaps children killed on drop before the process exits.
    drop(runtime);
    exit_on_error(result);
}

async fn wait_for_interrupt() {
    let mut terminate =
        tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()).ok();
    tokio::select! {
        _ = tokio::signal::ctrl_c() => {}
        _ = async { match terminate.as_mut() { Some(t) => { t.recv().await; } None => std::future::pending().await } } => {}
    }
}
