//! The simulated engine fleet behind `sim-engine`.
