//! The `kvgate` binary: parse flags, validate them into a config, run the gateway.

fn main() {
    eprintln!("kvgate: not wired yet");
    std::process::exit(2);
}
