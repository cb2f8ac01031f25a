//! The deterministic text tokenizer shared by `sim-engine` (to count and cache tokens) and `replay` (to build prompts of exact token lengths).
