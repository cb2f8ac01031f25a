//! What the gateway counts about each worker's KV-event stream ([`StreamStats`]), published by
//! the control core for `/metrics`, and why a subscription failed ([`Failure`]).

/// Why a worker's subscription failed (the `reason` label).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Failure {
    /// The publisher could not be reached.
    Connect,
    /// The publisher went away (the socket reconnects by itself).
    Disconnected,
    /// The socket failed while receiving; it is opened again.
    Receive,
    /// The replay socket did not answer (or not in time).
    Replay,
    /// Every index bit is taken by other publishing workers.
    TooManyWorkers,
    /// The worker's `/server_info` could not be read or announced an unusable endpoint.
    Discovery,
    /// The publisher (or its replay socket) announced a message past
    /// `KV_EVENTS_MESSAGE_BYTES_MAX`: the connection was cut before anything was allocated.
    TooLarge,
    /// The subscription's task panicked: it was started again.
    Panicked,
}

impl Failure {
    /// Every reason, in exposition order.
    pub const ALL: [Failure; 8] = [
        Failure::Connect,
        Failure::Disconnected,
        Failure::Receive,
        Failure::Replay,
        Failure::TooManyWorkers,
        Failure::Discovery,
        Failure::TooLarge,
        Failure::Panicked,
    ];

    /// Whether the stream is down after it (the others leave the live socket as it was).
    pub fn stops_stream(self) -> bool {
        matches!(
            self,
            Failure::Connect
                | Failure::Disconnected
                | Failure::Receive
                | Failure::TooLarge
                | Failure::Panicked
        )
    }

    /// The metric label.
    pub fn label(self) -> &'static str {
        match self {
            Failure::Connect => "connect",
            Failure::Disconnected => "disconnected",
            Failure::Receive => "receive",
            Failure::Replay => "replay",
            Failure::TooManyWorkers => "too_many_workers",
            Failure::Discovery => "discovery",
            Failure::TooLarge => "too_large",
            Failure::Panicked => "panicked",
        }
    }
}

/// Why a worker's entries were all dropped.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Reset {
    /// Batches were lost and no replay filled them: rebuilt from the next events.
    Gap,
    /// The publisher started over (an engine restart loses its cache).
    Restart,
    /// The stream was silent for `--kv-indexer-ttl-secs`.
    Expired,
    /// Reconnected to a publisher without a replay socket: nothing shows whether it restarted.
    Unverified,
}

impl Reset {
    /// Every reason, in exposition order.
    pub const ALL: [Reset; 4] = [
        Reset::Gap,
        Reset::Restart,
        Reset::Expired,
        Reset::Unverified,
    ];

    /// The metric label.
    pub fn label(self) -> &'static str {
        match self {
            Reset::Gap => "gap",
            Reset::Restart => "restart",
            Reset::Expired => "expired",
            Reset::Unverified => "unverified",
        }
    }
}

/// One worker's KV-event stream, as `/metrics` shows it.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct StreamStats {
    /// The worker's URL (the `worker` label).
    pub worker: String,
    /// Whether the subscription is connected.
    pub up: bool,
    /// Events applied to the index.
    pub events: u64,
    /// Blocks the worker stored that the index now lists for it.
    pub blocks_stored: u64,
    /// Blocks removed (evicted or cleared).
    pub blocks_removed: u64,
    /// Stored blocks whose parent was unknown (a missed event): not indexed.
    pub blocks_orphaned: u64,
    /// Stored blocks refused because the index holds `--kv-indexer-max-entries` blocks.
    pub blocks_refused: u64,
    /// Stored blocks refused because the worker holds its share of `--kv-indexer-max-entries`.
    pub blocks_over_share: u64,
    /// Batches applied from the live stream.
    pub batches_applied: u64,
    /// Batches applied from the replay socket.
    pub batches_replayed: u64,
    /// Batches that could not be decoded: counted and skipped.
    pub batches_malformed: u64,
    /// Batches seen already (duplicates, stale numbers): skipped.
    pub batches_skipped: u64,
    /// Subscription failures by [`Failure::ALL`] position.
    pub failures: [u64; Failure::ALL.len()],
    /// Entries dropped wholesale by [`Reset::ALL`] position.
    pub resets: [u64; Reset::ALL.len()],
    /// Blocks the index lists for the worker now.
    pub blocks_held: u64,
}

impl StreamStats {
    /// Counts a failure.
    pub fn fail(&mut self, failure: Failure) {
        if let Some(i) = Failure::ALL.iter().position(|f| *f == failure) {
            self.failures[i] += 1;
        }
    }

    /// Counts a reset.
    pub fn reset(&mut self, reset: Reset) {
        if let Some(i) = Reset::ALL.iter().position(|r| *r == reset) {
            self.resets[i] += 1;
        }
    }
}

/// The KV-event index's size, as `/metrics` shows it.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct IndexGauges {
    /// Entries (a block listed for a worker) by model name.
    pub models: Vec<(String, u64)>,
    /// Distinct blocks.
    pub blocks: u64,
    /// Bytes of the index's table and the workers' block maps.
    pub memory_bytes: u64,
    /// Requests the in-flight overlay follows.
    pub inflight_requests: u64,
    /// Blocks they hold provisionally, one per worker holding it.
    pub inflight_claims: u64,
}
