//! `sim-engine`: a simulated fleet of LLM engines on consecutive loopback ports.
fn main() {
    eprintln!("sim-engine: not built yet");
    std::process::exit(2);
}
