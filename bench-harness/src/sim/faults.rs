//! Fault injection of one simulated engine: [`Faults`], set by flags at start and replaced at run
//! time through `POST /sim/faults` (a partial JSON object; absent fields keep their value).
//!
//! Faults touch every endpoint except the `/sim/*` admin ones:
//! - `error_rate` (0..=1): that fraction of inference requests is answered `error_status`
//!   (500 or 429) with a JSON error, chosen by the engine's seeded generator;
//! - `latency_ms`: real milliseconds added before answering (not divided by `--speedup`, so a
//!   gateway timeout test means what it says);
//! - `hang`: requests are read and never answered (while the fault lasts; clearing it releases
//!   the waiting requests);
//! - `drop_mid_stream`: inference responses send their head and first chunk, then the connection
//!   is dropped;
//! - `unhealthy`: `/health` and `/health_generate` answer 503.

use serde::{Deserialize, Serialize};
use serde_json::Value;

/// The fault modes of one engine (all off by default).
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct Faults {
    pub error_rate: f64,
    pub error_status: u16,
    pub latency_ms: u64,
    pub hang: bool,
    pub drop_mid_stream: bool,
    pub unhealthy: bool,
}

impl Default for Faults {
    fn default() -> Self {
        Faults {
            error_rate: 0.0,
            error_status: 500,
            latency_ms: 0,
            hang: false,
            drop_mid_stream: false,
            unhealthy: false,
        }
    }
}

/// Largest added latency: an hour is "never" for any test; bounds the sleep.
pub const LATENCY_MS_MAX: u64 = 3_600_000;

impl Faults {
    /// Checks ranges; the message names the field.
    pub fn validate(&self) -> Result<(), String> {
        if !(0.0..=1.0).contains(&self.error_rate) {
            return Err(format!(
                "error_rate must be within 0..=1, got {}",
                self.error_rate
            ));
        }
        if !(400..=599).contains(&self.error_status) {
            return Err(format!(
                "error_status must be an HTTP error status, got {}",
                self.error_status
            ));
        }
        if self.latency_ms > LATENCY_MS_MAX {
            return Err(format!(
                "latency_ms must be at most {LATENCY_MS_MAX}, got {}",
                self.latency_ms
            ));
        }
        Ok(())
    }

    /// `self` with the fields present in `patch` replaced (`{"reset": true}` first clears all).
    pub fn patched(&self, patch: &Value) -> Result<Faults, String> {
        let object = patch.as_object().ok_or("faults must be a JSON object")?;
        let mut merged = serde_json::to_value(if patch.get("reset") == Some(&Value::Bool(true)) {
            Faults::default()
        } else {
            *self
        })
        .map_err(|error| error.to_string())?;
        for (key, value) in object {
            if key == "reset" {
                continue;
            }
            match merged.get_mut(key) {
                Some(slot) => *slot = value.clone(),
                None => return Err(format!("unknown fault field `{key}`")),
            }
        }
        let faults: Faults = serde_json::from_value(merged).map_err(|error| error.to_string())?;
        faults.validate()?;
        Ok(faults)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn patches_replace_only_named_fields() {
        let base = Faults {
            latency_ms: 5,
            ..Faults::default()
        };
        let patched = base
            .patched(&json!({"hang": true, "error_rate": 0.5}))
            .unwrap();
        assert!(patched.hang);
        assert_eq!(patched.latency_ms, 5);
        assert_eq!(patched.error_rate, 0.5);
        assert_eq!(
            patched.patched(&json!({"reset": true})).unwrap(),
            Faults::default()
        );
    }

    #[test]
    fn bad_patches_are_refused() {
        let base = Faults::default();
        assert!(base.patched(&json!({"error_rate": 2.0})).is_err());
        assert!(base.patched(&json!({"error_status": 200})).is_err());
        assert!(base.patched(&json!({"hang": "yes"})).is_err());
        assert!(base.patched(&json!({"explode": true})).is_err());
        assert!(base.patched(&json!([1])).is_err());
    }
}
