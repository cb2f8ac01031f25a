//! A worker's role in prefill/decode disaggregation (SMG's `worker_type`): a regular worker
//! serves whole requests; with `--pd-disaggregation` a prefill worker runs the prompt and hands
//! its KV cache over, and a decode worker generates from it. Owns [`WorkerRole`] and the
//! bootstrap-port syntax of `--prefill URL [BOOTSTRAP_PORT|none]` ([`parse_bootstrap_port`]).
//! A value that cannot be used is a `String` saying why; the caller names the flag or field.

/// What a worker does for a request.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum WorkerRole {
    /// The whole request (regular mode).
    #[default]
    Regular,
    /// The prompt, then the KV-cache transfer; SGLang's engines are told where to meet the
    /// decode worker through the bootstrap server on this port (`None`: the engine's default,
    /// sent as `null`, as SMG does).
    Prefill {
        /// The prefill engine's bootstrap server port.
        bootstrap_port: Option<u16>,
    },
    /// The generation, from the KV cache a prefill worker transferred.
    Decode,
}

/// Which side of a prefill/decode pair a selection is for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PdSide {
    /// The prefill worker.
    Prefill,
    /// The decode worker.
    Decode,
}

impl PdSide {
    /// The side's name, as SMG's `worker_type` and the 503's message say it.
    pub fn name(self) -> &'static str {
        match self {
            PdSide::Prefill => "prefill",
            PdSide::Decode => "decode",
        }
    }
}

impl WorkerRole {
    /// SMG's `worker_type` label: `regular`, `prefill` or `decode`.
    pub fn name(self) -> &'static str {
        match self {
            WorkerRole::Regular => "regular",
            WorkerRole::Prefill { .. } => "prefill",
            WorkerRole::Decode => "decode",
        }
    }

    /// Whether a worker of this role may be chosen for `side` of a pair: a decode worker is
    /// never chosen for prefill, nor a prefill worker for decode, nor a regular one for either.
    pub fn serves(self, side: PdSide) -> bool {
        matches!(
            (self, side),
            (WorkerRole::Prefill { .. }, PdSide::Prefill) | (WorkerRole::Decode, PdSide::Decode)
        )
    }

    /// The bootstrap port of a prefill worker (`None` for others, and for a prefill worker
    /// without one).
    pub fn bootstrap_port(self) -> Option<u16> {
        match self {
            WorkerRole::Prefill { bootstrap_port } => bootstrap_port,
            _ => None,
        }
    }
}

/// The token after `--prefill URL`: a port (1-65535) or `none` (any case), as SMG reads it.
pub fn parse_bootstrap_port(text: &str) -> Result<Option<u16>, String> {
    if text.eq_ignore_ascii_case("none") {
        return Ok(None);
    }
    match text.parse::<u16>() {
        Ok(0) => Err(format!("bootstrap port {text} must be 1-65535")),
        Ok(port) => Ok(Some(port)),
        Err(_) => Err(format!(
            "{text:?} after the URL is neither a bootstrap port (1-65535) nor none"
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bootstrap_ports_are_ports_or_none_as_smg_reads_them() {
        assert_eq!(parse_bootstrap_port("9001"), Ok(Some(9001)));
        assert_eq!(parse_bootstrap_port("none"), Ok(None));
        assert_eq!(parse_bootstrap_port("NONE"), Ok(None));
        for bad in ["0", "65536", "x", "-1", ""] {
            let error = parse_bootstrap_port(bad).expect_err(bad);
            assert!(error.contains(bad), "{error}");
        }
    }

    #[test]
    fn each_side_takes_only_its_own_role() {
        let prefill = WorkerRole::Prefill {
            bootstrap_port: Some(1),
        };
        assert!(prefill.serves(PdSide::Prefill) && !prefill.serves(PdSide::Decode));
        assert!(WorkerRole::Decode.serves(PdSide::Decode));
        assert!(!WorkerRole::Decode.serves(PdSide::Prefill));
        assert!(!WorkerRole::Regular.serves(PdSide::Prefill));
        assert!(!WorkerRole::Regular.serves(PdSide::Decode));
        assert_eq!(prefill.bootstrap_port(), Some(1));
        assert_eq!(WorkerRole::Decode.bootstrap_port(), None);
        assert_eq!(
            [
                prefill.name(),
                WorkerRole::Decode.name(),
                WorkerRole::Regular.name()
            ],
            ["prefill", "decode", "regular"]
        );
    }
}
