//! A worker's address: the one parser of worker URLs, used by `--worker-urls`, the admin API's
//! `POST /workers` and `DELETE /workers/{url}` alike, so a URL means the same thing everywhere.
//!
//! Owns [`WorkerUrl`] (the syntax: `http://host[:port][/]`, port 80 when absent, nothing else)
//! and [`WorkerSpec`] (a worker as the gateway uses it: the URL exactly as given, which is the
//! `x-smg-routed-worker-id` value, its resolved address and its `Host` header value). A URL that
//! cannot be used is a [`UrlError`] saying why.

use std::net::{IpAddr, Ipv4Addr, SocketAddr, ToSocketAddrs};

use super::role::WorkerRole;
use crate::error::FlagError;

/// The longest host name accepted (the DNS limit).
const HOST_LEN_MAX: usize = 253;

/// The port of a worker URL that names none (plain HTTP's).
pub const DEFAULT_PORT: u16 = 80;

/// Why a URL is not a usable worker URL.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum UrlError {
    /// Only plain `http://` workers are proxied.
    #[error("{0} must start with http://")]
    Scheme(String),
    /// Missing or malformed host.
    #[error("{0} has no valid host")]
    Host(String),
    /// A port that is not 1-65535.
    #[error("{0} has a bad port (1-65535)")]
    Port(String),
    /// A path, query, user info or fragment was given: the gateway appends the request path.
    #[error("{0} must be http://host:port without a path")]
    Path(String),
    /// The host did not resolve.
    #[error("cannot resolve {0}: {1}")]
    Resolve(String, String),
}

/// A syntactically valid worker URL.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct WorkerUrl {
    /// Host name or IP literal (IPv6 without its brackets).
    pub host: String,
    /// TCP port ([`DEFAULT_PORT`] when the URL names none).
    pub port: u16,
    /// `host:port` as written in the URL (brackets kept, port only if given): the `Host` header.
    pub authority: String,
}

impl WorkerUrl {
    /// Parses `http://host[:port][/]`.
    pub fn parse(url: &str) -> Result<WorkerUrl, UrlError> {
        // The scheme is case-insensitive (RFC 3986 3.1): `HTTP://` names the same worker.
        let rest = url
            .get(..7)
            .filter(|scheme| scheme.eq_ignore_ascii_case("http://"))
            .map(|_| &url[7..])
            .ok_or_else(|| UrlError::Scheme(url.to_string()))?;
        let authority = rest.strip_suffix('/').unwrap_or(rest);
        if authority.contains(['/', '?', '#', '@']) || authority.chars().any(char::is_whitespace) {
            return Err(UrlError::Path(url.to_string()));
        }
        let (host, port) = split_host_port(authority).ok_or_else(|| UrlError::Host(url.into()))?;
        let host_ok = !host.is_empty()
            && host.len() <= HOST_LEN_MAX
            && host
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || matches!(c, '.' | '-' | ':' | '_'));
        if !host_ok {
            return Err(UrlError::Host(url.to_string()));
        }
        let port = match port {
            None => DEFAULT_PORT,
            Some(text) => text
                .parse::<u16>()
                .ok()
                .filter(|p| *p != 0)
                .ok_or_else(|| UrlError::Port(url.to_string()))?,
        };
        Ok(WorkerUrl {
            host: host.to_string(),
            port,
            authority: authority.to_string(),
        })
    }

    /// One spelling per URL: `http://`, the authority in lower case (host names and the scheme
    /// are case-insensitive), no trailing `/`. The port stays as written: the same worker with
    /// and without `:80` is caught by [`WorkerSpec::same_endpoint`] instead.
    pub fn canonical(&self) -> String {
        format!("http://{}", self.authority.to_ascii_lowercase())
    }

    /// The first address the host resolves to (a DNS lookup for a name: call off the data path).
    pub fn resolve(&self) -> Result<SocketAddr, UrlError> {
        first_address(&self.host, self.port)
            .map_err(|why| UrlError::Resolve(self.authority.clone(), why))
    }
}

/// The first address `host` resolves to on `port` (a DNS lookup for a name: call off the data
/// path). The one host resolver: worker URLs, and the listening and mesh flags through
/// [`resolve_flag`].
pub fn first_address(host: &str, port: u16) -> Result<SocketAddr, String> {
    (host, port)
        .to_socket_addrs()
        .map_err(|e| e.to_string())?
        .next()
        .ok_or_else(|| "no address".to_string())
}

/// `host:port` of a flag resolved, or an error naming `flag`.
pub fn resolve_flag(flag: &'static str, host: &str, port: u16) -> Result<SocketAddr, FlagError> {
    first_address(host, port)
        .map_err(|why| FlagError::new(flag, format!("cannot resolve {host:?}: {why}")))
}

/// `host` and the port text, if any, of an authority; IPv6 literals come in brackets.
fn split_host_port(authority: &str) -> Option<(&str, Option<&str>)> {
    if let Some(v6) = authority.strip_prefix('[') {
        let (host, after) = v6.split_once(']')?;
        return match after {
            "" => Some((host, None)),
            _ => Some((host, Some(after.strip_prefix(':')?))),
        };
    }
    Some(match authority.split_once(':') {
        Some((host, port)) => (host, Some(port)),
        None => (authority, None),
    })
}

/// One upstream worker as the gateway uses it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct WorkerSpec {
    /// The URL exactly as given (the `x-smg-routed-worker-id` value and the metrics label).
    pub url: String,
    /// The resolved address the gateway connects to.
    pub addr: SocketAddr,
    /// `host:port` as written in the URL, for the upstream `Host` header.
    pub authority: String,
    /// Where it publishes its KV events.
    pub kv_events: KvEventsSource,
    /// Regular, or its side of a prefill/decode pair (`--prefill`, `--decode`, `worker_type`).
    pub role: WorkerRole,
}

impl WorkerSpec {
    /// Parses `url` and resolves its host.
    pub fn resolve(url: &str) -> Result<WorkerSpec, UrlError> {
        let parsed = WorkerUrl::parse(url)?;
        Ok(WorkerSpec {
            url: url.to_string(),
            addr: parsed.resolve()?,
            authority: parsed.authority,
            kv_events: KvEventsSource::Discover,
            role: WorkerRole::Regular,
        })
    }

    /// The host of its URL (IPv6 without brackets): the host of a wildcard KV-event endpoint.
    pub fn host(&self) -> &str {
        let authority = self.authority.as_str();
        match split_host_port(authority) {
            Some((host, _)) => host,
            None => authority,
        }
    }

    /// The URL without a trailing `/`: two spellings of one worker compare equal this way.
    pub fn normalized_url(&self) -> &str {
        self.url.trim_end_matches('/')
    }

    /// Whether `other` reaches the same engine: the same resolved address, every loopback
    /// address (`localhost`, `127.0.0.1`, `::1`), the unspecified ones (`0.0.0.0`, `0`, `::`:
    /// a connection to them reaches this host) and IPv4-mapped IPv6 counted as one, so no
    /// spelling of a URL registers one engine twice.
    pub fn same_endpoint(&self, other: &WorkerSpec) -> bool {
        endpoint_identity(self.addr) == endpoint_identity(other.addr)
    }
}

/// The address an endpoint is known by: loopback and unspecified addresses folded to
/// `127.0.0.1`, IPv4-mapped IPv6 to IPv4.
fn endpoint_identity(addr: SocketAddr) -> SocketAddr {
    let ip = match addr.ip() {
        IpAddr::V6(v6) => v6.to_ipv4_mapped().map_or(IpAddr::V6(v6), IpAddr::V4),
        v4 => v4,
    };
    let ip = if ip.is_loopback() || ip.is_unspecified() {
        IpAddr::V4(Ipv4Addr::LOCALHOST)
    } else {
        ip
    };
    SocketAddr::new(ip, addr.port())
}

/// Where a worker publishes its KV events: `--kv-events-endpoints` (one per `--worker-urls`
/// entry), `POST /workers`'s `kv_events_endpoint`, or the worker's own `GET /server_info`.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub enum KvEventsSource {
    /// Ask the worker: SGLang's `/server_info` carries its `kv_events_config`.
    #[default]
    Discover,
    /// `none`: this worker's events are not read.
    Off,
    /// The endpoint given.
    At(KvEventsEndpoint),
}

impl KvEventsSource {
    /// `auto` (ask the worker), `none`, or a [`KvEventsEndpoint`] (wildcard hosts become
    /// `worker_host`).
    pub fn parse(text: &str, worker_host: &str) -> Result<KvEventsSource, String> {
        match text {
            "auto" => Ok(KvEventsSource::Discover),
            "none" => Ok(KvEventsSource::Off),
            _ => KvEventsEndpoint::parse(text, worker_host).map(KvEventsSource::At),
        }
    }
}

/// A worker's ZMQ KV-event sockets: the publisher (`PUB`) and, when it has one, the replay
/// socket (`ROUTER`) that resends missed batches.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct KvEventsEndpoint {
    /// `tcp://host:port` of the `PUB` socket.
    pub publisher: String,
    /// `tcp://host:port` of the replay socket.
    pub replay: Option<String>,
}

impl KvEventsEndpoint {
    /// `tcp://host:port`, or `tcp://host:port+tcp://host:port` (publisher, then replay). A
    /// wildcard bind host (`*`, `0.0.0.0`, `::`) means the worker's own host, `worker_host`.
    pub fn parse(text: &str, worker_host: &str) -> Result<KvEventsEndpoint, String> {
        let (publisher, replay) = match text.split_once('+') {
            Some((publisher, replay)) => (publisher, Some(replay)),
            None => (text, None),
        };
        Ok(KvEventsEndpoint {
            publisher: zmq_tcp_endpoint(publisher, worker_host)?,
            replay: replay
                .map(|replay| zmq_tcp_endpoint(replay, worker_host))
                .transpose()?,
        })
    }

    /// The endpoint a worker's `GET /server_info` body announces (SGLang: `kv_events_config`,
    /// a JSON string or object with `publisher`, `endpoint` and `replay_endpoint`); `None` when
    /// it publishes no events over ZMQ.
    pub fn from_server_info(
        body: &[u8],
        worker_host: &str,
    ) -> Result<Option<KvEventsEndpoint>, String> {
        let info: serde_json::Value =
            serde_json::from_slice(body).map_err(|e| format!("server_info is not JSON: {e}"))?;
        let config = match info.get("kv_events_config") {
            None | Some(serde_json::Value::Null) => return Ok(None),
            Some(serde_json::Value::String(text)) if text.trim().is_empty() => return Ok(None),
            Some(serde_json::Value::String(text)) => serde_json::from_str(text)
                .map_err(|e| format!("kv_events_config is not JSON: {e}"))?,
            Some(object) => object.clone(),
        };
        let field = |name: &str| config.get(name).and_then(serde_json::Value::as_str);
        // SGLang's defaults: no publisher unless "zmq"; the endpoint `tcp://*:5557`.
        if field("publisher") != Some("zmq") {
            return Ok(None);
        }
        let publisher = field("endpoint").unwrap_or("tcp://*:5557");
        Ok(Some(KvEventsEndpoint {
            publisher: zmq_tcp_endpoint(publisher, worker_host)?,
            replay: field("replay_endpoint")
                .map(|replay| zmq_tcp_endpoint(replay, worker_host))
                .transpose()?,
        }))
    }
}

/// `tcp://host:port` with a wildcard host replaced by `worker_host`.
fn zmq_tcp_endpoint(text: &str, worker_host: &str) -> Result<String, String> {
    let bad = || format!("{text}: expected tcp://host:port (or none, or auto)");
    let authority = text.strip_prefix("tcp://").ok_or_else(bad)?;
    let (host, port) = split_host_port(authority).ok_or_else(bad)?;
    let port = port
        .and_then(|p| p.parse::<u16>().ok())
        .filter(|p| *p != 0)
        .ok_or_else(bad)?;
    let host = match host {
        "*" | "0.0.0.0" | "::" | "" => worker_host,
        host => host,
    };
    let valid_host = host
        .chars()
        .all(|c| c.is_ascii_alphanumeric() || matches!(c, '.' | '-' | ':' | '_'));
    if host.is_empty() || host.len() > HOST_LEN_MAX || !valid_host {
        return Err(bad());
    }
    Ok(match host.contains(':') {
        true => format!("tcp://[{host}]:{port}"),
        false => format!("tcp://{host}:{port}"),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn urls_parse_with_the_default_port_and_keep_their_authority() {
        let url = WorkerUrl::parse("http://127.0.0.1:8000").unwrap();
        assert_eq!((url.host.as_str(), url.port), ("127.0.0.1", 8000));
        assert_eq!(url.authority, "127.0.0.1:8000");
        let url = WorkerUrl::parse("http://worker-1.local/").unwrap();
        assert_eq!((url.port, url.authority.as_str()), (80, "worker-1.local"));
        let url = WorkerUrl::parse("http://[::1]:9").unwrap();
        assert_eq!((url.host.as_str(), url.port), ("::1", 9));
        assert_eq!(url.authority, "[::1]:9");
        assert_eq!(WorkerUrl::parse("http://[::1]").unwrap().port, 80);
    }

    #[test]
    fn bad_urls_say_what_is_wrong() {
        type Expected = fn(&UrlError) -> bool;
        let cases: &[(&str, Expected)] = &[
            ("https://a:1", |e| matches!(e, UrlError::Scheme(_))),
            ("a:1", |e| matches!(e, UrlError::Scheme(_))),
            ("http://a:0", |e| matches!(e, UrlError::Port(_))),
            ("http://a:", |e| matches!(e, UrlError::Port(_))),
            ("http://a:70000", |e| matches!(e, UrlError::Port(_))),
            ("http://:80", |e| matches!(e, UrlError::Host(_))),
            ("http://", |e| matches!(e, UrlError::Host(_))),
            ("http://a%b:80", |e| matches!(e, UrlError::Host(_))),
            ("http://[::1:80", |e| matches!(e, UrlError::Host(_))),
            ("http://a:80/v1", |e| matches!(e, UrlError::Path(_))),
            ("http://u@a:80", |e| matches!(e, UrlError::Path(_))),
            ("http://a b:80", |e| matches!(e, UrlError::Path(_))),
        ];
        for (url, expected) in cases {
            let error = WorkerUrl::parse(url).unwrap_err();
            assert!(expected(&error), "{url}: {error:?}");
            assert!(error.to_string().contains(url), "{error}");
        }
    }

    #[test]
    fn kv_event_endpoints_parse_with_wildcards_as_the_worker_host() {
        let at = |publisher: &str, replay: Option<&str>| {
            KvEventsSource::At(KvEventsEndpoint {
                publisher: publisher.into(),
                replay: replay.map(Into::into),
            })
        };
        let parse = |text| KvEventsSource::parse(text, "10.0.0.7");
        assert_eq!(parse("none"), Ok(KvEventsSource::Off));
        assert_eq!(parse("auto"), Ok(KvEventsSource::Discover));
        assert_eq!(parse("tcp://*:5557"), Ok(at("tcp://10.0.0.7:5557", None)));
        assert_eq!(
            parse("tcp://h:1+tcp://0.0.0.0:2"),
            Ok(at("tcp://h:1", Some("tcp://10.0.0.7:2")))
        );
        let v6 = KvEventsSource::parse("tcp://[::]:5557", "::1");
        assert_eq!(v6, Ok(at("tcp://[::1]:5557", None)));
        for bad in [
            "ipc:///tmp/x",
            "tcp://h",
            "tcp://h:0",
            "tcp://h:x",
            "tcp://a b:1",
            "h:1",
        ] {
            let error = parse(bad).expect_err(bad);
            assert!(
                error.contains(bad.split('+').next().unwrap_or(bad)),
                "{error}"
            );
        }
    }

    #[test]
    fn server_info_announces_the_endpoint_as_sglang_writes_it() {
        let info = |config: &str| format!(r#"{{"page_size":16,"kv_events_config":{config}}}"#);
        let found = |body: String| KvEventsEndpoint::from_server_info(body.as_bytes(), "w1");
        let string = info(
            r#""{\"publisher\":\"zmq\",\"endpoint\":\"tcp://*:5557\",\"replay_endpoint\":\"tcp://*:5558\"}""#,
        );
        let expected = KvEventsEndpoint {
            publisher: "tcp://w1:5557".into(),
            replay: Some("tcp://w1:5558".into()),
        };
        assert_eq!(found(string), Ok(Some(expected)));
        let object = info(r#"{"publisher":"zmq"}"#);
        let default = KvEventsEndpoint {
            publisher: "tcp://w1:5557".into(),
            replay: None,
        };
        assert_eq!(found(object), Ok(Some(default)));
        assert_eq!(found(info("null")), Ok(None));
        assert_eq!(found(info(r#""{\"publisher\":\"null\"}""#)), Ok(None));
        assert_eq!(found("{}".into()), Ok(None));
        assert!(found("not json".into()).is_err());
        assert!(found(info(r#""{oops""#)).is_err());
    }

    #[test]
    fn spellings_of_one_worker_are_one_endpoint() {
        let base = WorkerSpec::resolve("http://127.0.0.1:31002").unwrap();
        for spelling in [
            "http://127.0.0.1:31002/",
            "HTTP://127.0.0.1:31002",
            "http://localhost:31002",
            "Http://LocalHost:31002/",
            "http://[::1]:31002",
            "http://[::ffff:127.0.0.1]:31002",
            "http://0.0.0.0:31002",
            "http://0:31002",
            "http://[::]:31002",
        ] {
            let spec = WorkerSpec::resolve(spelling).unwrap();
            assert!(base.same_endpoint(&spec), "{spelling}");
        }
        for other in ["http://127.0.0.1:31003", "http://192.0.2.1:31002"] {
            assert!(
                !base.same_endpoint(&WorkerSpec::resolve(other).unwrap()),
                "{other}"
            );
        }
        let port80 = WorkerSpec::resolve("http://localhost").unwrap();
        assert!(port80.same_endpoint(&WorkerSpec::resolve("http://127.0.0.1:80/").unwrap()));
        let url = WorkerUrl::parse("HTTP://Worker-1.Local:8000/").unwrap();
        assert_eq!(url.canonical(), "http://worker-1.local:8000");
    }

    #[test]
    fn specs_resolve_and_keep_the_exact_spelling() {
        let spec = WorkerSpec::resolve("http://127.0.0.1:31002/").unwrap();
        assert_eq!(spec.url, "http://127.0.0.1:31002/");
        assert_eq!(spec.normalized_url(), "http://127.0.0.1:31002");
        assert_eq!(spec.addr, "127.0.0.1:31002".parse().unwrap());
        assert_eq!(spec.authority, "127.0.0.1:31002");
        assert!(matches!(
            WorkerSpec::resolve("http://no-such-host.invalid:1"),
            Err(UrlError::Resolve(..))
        ));
    }
}
