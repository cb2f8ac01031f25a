//! `replay`: replays traces or generated workloads through a gateway and reports what happened.
fn main() {
    eprintln!("replay: not built yet");
    std::process::exit(2);
}
