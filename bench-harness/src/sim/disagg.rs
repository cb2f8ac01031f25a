//! Prefill/decode roles of a simulated engine (`--role prefill|decode`), speaking both engines'
//! handshakes as a gateway sees them:
//!
//! - **SGLang**: both workers get the request with `bootstrap_host`, `bootstrap_port` and
//!   `bootstrap_room` (lists, one per item, for a batch). The prefill engine runs the prompt
//!   against its prefix cache, generates one token, "transfers" the KV cache (sleeps prompt
//!   tokens / `--transfer-tokens-per-s`, scaled by `--speedup`), marks the rooms done and then
//!   answers. The decode engine asks the prefill's bootstrap server (the sim serves it on the
//!   engine's HTTP port: `GET /sim/transfer?room=R&wait_ms=T`) until its rooms are done, then
//!   decodes with the prompt's KV cache received (nothing of it computed).
//! - **vLLM**: the prefill gets `kv_transfer_params.do_remote_decode`, answers once its one token
//!   is out with `kv_transfer_params` naming itself (`remote_host`, `remote_port`,
//!   `remote_request_id`), and the transfer completes in the background; the decode gets
//!   `kv_transfer_params.do_remote_prefill` and pulls from there.
//!
//! A decode engine whose transfer never comes fails the request after `--transfer-timeout-ms`
//! with 500 and SGLang's error (`KVTransferError`); a request without the handshake's fields is
//! refused with 400, as the engines refuse it. Owns [`SimRole`], [`Handoff`] (what a body says),
//! [`Transfers`] (a prefill engine's finished rooms) and [`fetch_transfer`] (the decode's ask).

use std::collections::{HashMap, VecDeque};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use serde_json::Value;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio::sync::Notify;

/// Rooms a prefill engine remembers as transferred: a decode engine asks soon after, so the
/// oldest go first past this bound.
pub const TRANSFERS_KEPT_MAX: usize = 65_536;

/// Longest wait one transfer question may ask for (the decode asks again after it).
pub const TRANSFER_WAIT_MAX: Duration = Duration::from_secs(10);

/// An engine's part in disaggregated serving.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, clap::ValueEnum)]
pub enum SimRole {
    /// Whole requests.
    #[default]
    #[value(name = "regular")]
    Regular,
    /// The prompt, then the KV-cache transfer.
    #[value(name = "prefill")]
    Prefill,
    /// The generation, from a transferred KV cache.
    #[value(name = "decode")]
    Decode,
}

impl SimRole {
    /// SGLang's `disaggregation_mode`: `null`, `prefill` or `decode`.
    pub fn mode_json(self) -> Value {
        match self {
            SimRole::Regular => Value::Null,
            SimRole::Prefill => Value::from("prefill"),
            SimRole::Decode => Value::from("decode"),
        }
    }
}

/// The PD settings of a fleet.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct DisaggOptions {
    /// The engines' role.
    pub role: SimRole,
    /// KV-cache transfer speed, prompt tokens per simulated second.
    pub transfer_tokens_per_s: f64,
    /// How long a decode engine waits for its transfer (real time).
    pub transfer_timeout: Duration,
}

/// What a request body says about the handshake.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Handoff {
    /// No handshake field: a regular request.
    None,
    /// SGLang: where the prefill's bootstrap server is, and the rooms (one per batch item).
    Bootstrap {
        host: String,
        port: u16,
        rooms: Vec<u64>,
    },
    /// vLLM, to a prefill: keep the KV cache for a remote decode.
    RemoteDecode,
    /// vLLM, to a decode: pull the KV cache of `request_id` from `host:port`.
    RemotePrefill {
        host: String,
        port: u16,
        request_id: u64,
    },
}

impl Handoff {
    /// Reads the handshake fields of `body`; `Err` says what is malformed.
    pub fn of(body: &Value) -> Result<Handoff, String> {
        if let Some(params) = body.get("kv_transfer_params").filter(|p| !p.is_null()) {
            let flag = |name: &str| params.get(name).and_then(Value::as_bool) == Some(true);
            if flag("do_remote_decode") {
                return Ok(Handoff::RemoteDecode);
            }
            if flag("do_remote_prefill") {
                let host = params.get("remote_host").and_then(Value::as_str);
                let port = params.get("remote_port").and_then(Value::as_u64);
                let id = params.get("remote_request_id").and_then(Value::as_u64);
                return match (host, port.and_then(|p| u16::try_from(p).ok()), id) {
                    (Some(host), Some(port), Some(request_id)) => Ok(Handoff::RemotePrefill {
                        host: host.to_string(),
                        port,
                        request_id,
                    }),
                    _ => Err("kv_transfer_params: remote_host, remote_port and \
                              remote_request_id are required"
                        .into()),
                };
            }
            return Err(
                "kv_transfer_params: neither do_remote_decode nor do_remote_prefill".into(),
            );
        }
        let Some(room) = body.get("bootstrap_room").filter(|r| !r.is_null()) else {
            return Ok(Handoff::None);
        };
        let first = |v: &Value| match v {
            Value::Array(items) => items.first().cloned().unwrap_or(Value::Null),
            other => other.clone(),
        };
        let host = body.get("bootstrap_host").map(first);
        let port = body.get("bootstrap_port").map(first);
        let rooms: Option<Vec<u64>> = match room {
            Value::Array(items) => items.iter().map(Value::as_u64).collect(),
            single => single.as_u64().map(|r| vec![r]),
        };
        match (
            host.as_ref().and_then(Value::as_str),
            port.as_ref().and_then(Value::as_u64),
            rooms,
        ) {
            (Some(host), Some(port), Some(rooms)) if !rooms.is_empty() => Ok(Handoff::Bootstrap {
                host: host.to_string(),
                port: u16::try_from(port).map_err(|_| "bootstrap_port: not a port")?,
                rooms,
            }),
            _ => Err(
                "bootstrap_host, bootstrap_port and bootstrap_room must name the prefill \
                      engine's bootstrap server and rooms"
                    .into(),
            ),
        }
    }
}

/// The rooms a prefill engine has transferred, and the decode engines waiting on them.
#[derive(Debug, Default)]
pub struct Transfers {
    done: Mutex<TransferLog>,
    changed: Notify,
}

/// One finished transfer: the prompt's tokens, and how many of them the prefill engine found
/// in its prefix cache (a decode engine reports those as its answer's cached tokens: the prompt
/// was served from the prefill's cache, so a replay's hit rate is the prefill side's).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Transfer {
    pub tokens: u32,
    pub cached: u32,
}

#[derive(Debug, Default)]
struct TransferLog {
    /// Room → what was transferred.
    rooms: HashMap<u64, Transfer>,
    order: VecDeque<u64>,
}

impl Transfers {
    /// Marks `room` transferred and wakes whoever waits on it.
    pub fn complete(&self, room: u64, transfer: Transfer) {
        if let Ok(mut log) = self.done.lock() {
            if log.rooms.insert(room, transfer).is_none() {
                log.order.push_back(room);
            }
            while log.order.len() > TRANSFERS_KEPT_MAX {
                if let Some(old) = log.order.pop_front() {
                    log.rooms.remove(&old);
                }
            }
        }
        self.changed.notify_waiters();
    }

    /// `room`'s transfer once it is done, waiting at most `wait`; `None` if not.
    pub async fn wait(&self, room: u64, wait: Duration) -> Option<Transfer> {
        let deadline = Instant::now() + wait.min(TRANSFER_WAIT_MAX);
        loop {
            let notified = self.changed.notified();
            tokio::pin!(notified);
            notified.as_mut().enable();
            if let Some(tokens) = self.done.lock().ok()?.rooms.get(&room).copied() {
                return Some(tokens);
            }
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() || tokio::time::timeout(left, notified).await.is_err() {
                return None;
            }
        }
    }
}

/// The time the KV cache of `tokens` prompt tokens takes to move, in real time.
pub fn transfer_time(tokens: u32, options: &DisaggOptions, speedup: f64) -> Duration {
    let secs = f64::from(tokens) / options.transfer_tokens_per_s / speedup;
    Duration::from_secs_f64(secs.clamp(0.0, 3600.0))
}

/// Asks the prefill engine at `host:port` for `room` until it is transferred or `timeout`
/// passes; `Err` says why not (SGLang's `KVTransferError` wording).
pub async fn fetch_transfer(
    host: &str,
    port: u16,
    room: u64,
    timeout: Duration,
) -> Result<Transfer, String> {
    let deadline = Instant::now() + timeout;
    let failed = |why: String| format!("KVTransferError(bootstrap_room={room}): {why}");
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return Err(failed(format!(
                "no KV cache transferred within {} ms",
                timeout.as_millis()
            )));
        }
        let wait = left.min(TRANSFER_WAIT_MAX);
        let asked =
            tokio::time::timeout(wait + Duration::from_secs(1), ask(host, port, room, wait));
        match asked.await {
            Ok(Ok(Some(transfer))) => return Ok(transfer),
            Ok(Ok(None)) => continue,
            Ok(Err(why)) => {
                // The prefill engine is unreachable: try again until the deadline, as the
                // engines' bootstrap does, without spinning.
                tokio::time::sleep(Duration::from_millis(20).min(left)).await;
                if Instant::now() >= deadline {
                    return Err(failed(why));
                }
            }
            Err(_) => continue,
        }
    }
}

/// One question to the bootstrap server: `Some` when done, `None` when still pending.
async fn ask(host: &str, port: u16, room: u64, wait: Duration) -> Result<Option<Transfer>, String> {
    let mut stream = TcpStream::connect((host, port))
        .await
        .map_err(|e| format!("cannot reach the bootstrap server {host}:{port}: {e}"))?;
    let request = format!(
        "GET /sim/transfer?room={room}&wait_ms={} HTTP/1.1\r\nhost: {host}:{port}\r\nconnection: close\r\n\r\n",
        wait.as_millis()
    );
    stream
        .write_all(request.as_bytes())
        .await
        .map_err(|e| e.to_string())?;
    let mut answer = Vec::new();
    (&mut stream)
        .take(64 * 1024)
        .read_to_end(&mut answer)
        .await
        .map_err(|e| e.to_string())?;
    let text = String::from_utf8_lossy(&answer);
    let status = text.split(' ').nth(1).unwrap_or("");
    if status != "200" {
        return Ok(None);
    }
    let body = text.split("\r\n\r\n").nth(1).unwrap_or("");
    let answer = serde_json::from_str::<Value>(body).unwrap_or_default();
    let field = |name: &str| answer.get(name).and_then(Value::as_u64).unwrap_or(0);
    let count = |n: u64| u32::try_from(n).unwrap_or(u32::MAX);
    Ok(Some(Transfer {
        tokens: count(field("tokens")),
        cached: count(field("cached")),
    }))
}

/// The `room` and `wait_ms` of a `/sim/transfer` query.
pub fn transfer_query(query: &str) -> Option<(u64, Duration)> {
    let mut room = None;
    let mut wait = Duration::ZERO;
    for pair in query.split('&') {
        match pair.split_once('=') {
            Some(("room", value)) => room = value.parse().ok(),
            Some(("wait_ms", value)) => wait = Duration::from_millis(value.parse().ok()?),
            _ => {}
        }
    }
    Some((room?, wait))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn handoffs_read_both_engines_fields() {
        let of = |text: &str| Handoff::of(&serde_json::from_str(text).unwrap());
        assert_eq!(of(r#"{"text":"a"}"#), Ok(Handoff::None));
        assert_eq!(
            of(r#"{"bootstrap_host":"h","bootstrap_port":9,"bootstrap_room":5}"#),
            Ok(Handoff::Bootstrap {
                host: "h".into(),
                port: 9,
                rooms: vec![5]
            })
        );
        assert_eq!(
            of(r#"{"bootstrap_host":["h","h"],"bootstrap_port":[9,9],"bootstrap_room":[5,6]}"#),
            Ok(Handoff::Bootstrap {
                host: "h".into(),
                port: 9,
                rooms: vec![5, 6]
            })
        );
        assert!(of(r#"{"bootstrap_host":"h","bootstrap_port":null,"bootstrap_room":5}"#).is_err());
        assert_eq!(
            of(r#"{"kv_transfer_params":{"do_remote_decode":true}}"#),
            Ok(Handoff::RemoteDecode)
        );
        assert_eq!(
            of(
                r#"{"kv_transfer_params":{"do_remote_prefill":true,"remote_host":"h","remote_port":3,"remote_request_id":7}}"#
            ),
            Ok(Handoff::RemotePrefill {
                host: "h".into(),
                port: 3,
                request_id: 7
            })
        );
        assert!(of(r#"{"kv_transfer_params":{"do_remote_prefill":true}}"#).is_err());
    }

    #[tokio::test]
    async fn a_waiter_wakes_when_its_room_is_transferred_and_not_before() {
        let transfers = std::sync::Arc::new(Transfers::default());
        assert_eq!(transfers.wait(1, Duration::from_millis(10)).await, None);
        let later = std::sync::Arc::clone(&transfers);
        let waiter = tokio::spawn(async move { later.wait(1, Duration::from_secs(5)).await });
        tokio::time::sleep(Duration::from_millis(20)).await;
        let transfer = |tokens| Transfer { tokens, cached: 8 };
        transfers.complete(2, transfer(9));
        transfers.complete(1, transfer(40));
        assert_eq!(waiter.await.unwrap(), Some(transfer(40)));
        assert_eq!(
            transfer_query("room=5&wait_ms=30"),
            Some((5, Duration::from_millis(30)))
        );
        assert_eq!(transfer_query("wait_ms=30"), None);
    }
}
