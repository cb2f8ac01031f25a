//! A worker's address: the one parser of worker URLs, used by `--worker-urls`, the admin API's
//! `POST /workers` and `DELETE /workers/{url}` alike, so a URL means the same thing everywhere.
//!
//! Owns [`WorkerUrl`] (the syntax: `http://host[:port][/]` or `https://`, port 80 or 443 when
//! absent, or `grpc://host:port[/]` for an engine speaking SMG's gRPC protocols, nothing else),
//! [`Scheme`] (plain or TLS), [`WorkerProtocol`] (HTTP/1.1 or gRPC) and [`WorkerSpec`] (a worker
//! as the gateway uses it: the URL exactly as given, which is the `x-smg-routed-worker-id` value,
//! its scheme and protocol, its resolved address and its `Host` header value). A URL that cannot
//! be used is a [`UrlError`] saying why.

use std::net::{IpAddr, Ipv4Addr, SocketAddr, ToSocketAddrs};

use super::role::WorkerRole;
use crate::error::FlagError;
use crate::limits::KV_EVENTS_DP_RANKS_MAX;

/// The longest host name accepted (the DNS limit).
const HOST_LEN_MAX: usize = 253;

/// The port of an `http://` worker URL that names none (plain HTTP's).
pub const DEFAULT_PORT: u16 = 80;

/// Whether the gateway's connections to a worker are plain or TLS: its URL's scheme.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Scheme {
    /// `http://` and `grpc://`: plain TCP.
    Http,
    /// `https://`: HTTP/1.1 over TLS, the worker's certificate checked (`net::tls`).
    Https,
}

impl Scheme {
    /// The port of a URL that names none.
    pub fn default_port(self) -> u16 {
        match self {
            Scheme::Http => DEFAULT_PORT,
            Scheme::Https => 443,
        }
    }
}

/// The URL prefixes a worker may have, with what each means.
const URL_PREFIXES: [(&str, Scheme, WorkerProtocol); 3] = [
    ("http://", Scheme::Http, WorkerProtocol::Http),
    ("https://", Scheme::Https, WorkerProtocol::Http),
    ("grpc://", Scheme::Http, WorkerProtocol::Grpc(None)),
];

/// The URL prefix of a scheme and protocol, as the canonical spelling writes it.
pub fn url_prefix(scheme: Scheme, protocol: WorkerProtocol) -> &'static str {
    match (scheme, protocol) {
        (Scheme::Http, WorkerProtocol::Http) => "http://",
        (Scheme::Https, _) => "https://",
        (Scheme::Http, WorkerProtocol::Grpc(_)) => "grpc://",
    }
}

/// Why a URL is not a usable worker URL.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum UrlError {
    /// Only `http://`, `https://` and `grpc://` workers are proxied.
    #[error("{0} must start with http://, https:// or grpc://")]
    Scheme(String),
    /// Missing or malformed host.
    #[error("{0} has no valid host")]
    Host(String),
    /// A `grpc://` URL without a port: gRPC has no default port to assume.
    #[error("{0} must name its port (grpc://host:port)")]
    GrpcPort(String),
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

/// How the gateway talks to a worker, from its URL's scheme.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum WorkerProtocol {
    /// `http://`: HTTP/1.1, the request forwarded as the client sent it.
    Http,
    /// `grpc://`: HTTP/2 gRPC (SGLang's or vLLM's scheduler service): the gateway tokenizes and
    /// builds the engine's `GenerateRequest` (`grpc`, `http::upstream::grpc`). The backend is
    /// `--backend`'s, or `None`: detected by asking the worker.
    Grpc(Option<GrpcBackend>),
}

/// The engine protocol a `grpc://` worker speaks (SMG's `--backend`; detected per worker when
/// the flag is absent).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum GrpcBackend {
    /// SGLang's scheduler service (`sglang serve --grpc-mode`).
    Sglang,
    /// vLLM's engine service (`vllm serve --grpc`).
    Vllm,
}

impl GrpcBackend {
    /// The `--backend` value (`sglang`, `vllm`).
    pub fn parse(text: &str) -> Option<GrpcBackend> {
        match text {
            "sglang" => Some(GrpcBackend::Sglang),
            "vllm" => Some(GrpcBackend::Vllm),
            _ => None,
        }
    }

    /// The flag's spelling.
    pub fn name(self) -> &'static str {
        match self {
            GrpcBackend::Sglang => "sglang",
            GrpcBackend::Vllm => "vllm",
        }
    }
}

/// A syntactically valid worker URL.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct WorkerUrl {
    /// Plain or TLS.
    pub scheme: Scheme,
    /// HTTP/1.1 or gRPC.
    pub protocol: WorkerProtocol,
    /// Host name or IP literal (IPv6 without its brackets).
    pub host: String,
    /// TCP port (the scheme's default when the URL names none).
    pub port: u16,
    /// `host:port` as written in the URL (brackets kept, port only if given): the `Host` header.
    pub authority: String,
}

impl WorkerUrl {
    /// Parses `http://host[:port][/]`, `https://host[:port][/]` or `grpc://host:port[/]`.
    pub fn parse(url: &str) -> Result<WorkerUrl, UrlError> {
        // The scheme is case-insensitive (RFC 3986 3.1): `HTTP://` names the same worker.
        let (&(prefix, scheme, protocol), rest) = URL_PREFIXES
            .iter()
            .find_map(|entry| {
                url.get(..entry.0.len())
                    .filter(|head| head.eq_ignore_ascii_case(entry.0))
                    .map(|_| (entry, &url[entry.0.len()..]))
            })
            .ok_or_else(|| UrlError::Scheme(url.to_string()))?;
        debug_assert_eq!(prefix, url_prefix(scheme, protocol));
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
            None if protocol != WorkerProtocol::Http => {
                return Err(UrlError::GrpcPort(url.to_string()))
            }
            None => scheme.default_port(),
            Some(text) => text
                .parse::<u16>()
                .ok()
                .filter(|p| *p != 0)
                .ok_or_else(|| UrlError::Port(url.to_string()))?,
        };
        Ok(WorkerUrl {
            scheme,
            protocol,
            host: host.to_string(),
            port,
            authority: authority.to_string(),
        })
    }

    /// One spelling per URL: the scheme's prefix, the authority in lower case (host names and
    /// the scheme are case-insensitive), no trailing `/`. The port stays as written: the same
    /// worker with and without `:80` is caught by [`WorkerSpec::same_endpoint`] instead.
    pub fn canonical(&self) -> String {
        let authority = self.authority.to_ascii_lowercase();
        format!("{}{authority}", url_prefix(self.scheme, self.protocol))
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

/// The host of an authority (`host:port` as a URL writes it), IPv6 without its brackets.
pub fn authority_host(authority: &str) -> &str {
    match split_host_port(authority) {
        Some((host, _)) => host,
        None => authority,
    }
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
    /// Plain HTTP or TLS, as the URL says.
    pub scheme: Scheme,
    /// The resolved address the gateway connects to.
    pub addr: SocketAddr,
    /// `host:port` as written in the URL, for the upstream `Host` header.
    pub authority: String,
    /// Where it publishes its KV events.
    pub kv_events: KvEventsSource,
    /// How the gateway talks to it (its URL's scheme).
    pub protocol: WorkerProtocol,
    /// Regular, or its side of a prefill/decode pair (`--prefill`, `--decode`, `worker_type`).
    pub role: WorkerRole,
}

impl WorkerSpec {
    /// Parses `url` and resolves its host.
    pub fn resolve(url: &str) -> Result<WorkerSpec, UrlError> {
        let parsed = WorkerUrl::parse(url)?;
        Ok(WorkerSpec {
            url: url.to_string(),
            scheme: parsed.scheme,
            addr: parsed.resolve()?,
            authority: parsed.authority,
            kv_events: KvEventsSource::Discover,
            protocol: parsed.protocol,
            role: WorkerRole::Regular,
        })
    }

    /// The host of its URL (IPv6 without brackets): the host of a wildcard KV-event endpoint,
    /// and the name an `https://` worker's certificate must carry.
    pub fn host(&self) -> &str {
        authority_host(&self.authority)
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
    /// vLLM's data-parallel ranks (`?dp_size=N`, N > 1): rank `r` publishes, and replays, at
    /// the endpoint's ports plus `r`, each with its own numbered batches.
    Ranks {
        /// Rank 0's sockets.
        endpoint: KvEventsEndpoint,
        /// How many ranks publish (2 to `KV_EVENTS_DP_RANKS_MAX`).
        dp_size: u16,
    },
}

impl KvEventsSource {
    /// `auto` (ask the worker), `none`, or a [`KvEventsEndpoint`] (wildcard hosts become
    /// `worker_host`), optionally followed by `?dp_size=N` for an engine of N data-parallel
    /// ranks (vLLM's `--data-parallel-size`: each rank's sockets at the given ports plus its
    /// rank).
    pub fn parse(text: &str, worker_host: &str) -> Result<KvEventsSource, String> {
        let (text, dp_size) = match text.split_once("?dp_size=") {
            Some((text, size)) => {
                let bad = || format!("{size}: dp_size must be 1 to {KV_EVENTS_DP_RANKS_MAX}");
                let size: u16 = size.parse().map_err(|_| bad())?;
                if size == 0 || size > KV_EVENTS_DP_RANKS_MAX {
                    return Err(bad());
                }
                (text, size)
            }
            None => (text, 1),
        };
        match text {
            "auto" | "none" if dp_size > 1 => Err(format!("{text}: dp_size needs an endpoint")),
            "auto" => Ok(KvEventsSource::Discover),
            "none" => Ok(KvEventsSource::Off),
            _ => {
                let endpoint = KvEventsEndpoint::parse(text, worker_host)?;
                if dp_size == 1 {
                    return Ok(KvEventsSource::At(endpoint));
                }
                // Every rank's ports must exist.
                endpoint.rank(dp_size - 1)?;
                Ok(KvEventsSource::Ranks { endpoint, dp_size })
            }
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

    /// Data-parallel rank `rank`'s sockets: this endpoint's ports plus `rank` (vLLM's
    /// `ZmqEventPublisher.offset_endpoint_port`, for the publisher and the replay socket).
    pub fn rank(&self, rank: u16) -> Result<KvEventsEndpoint, String> {
        let offset = |endpoint: &str| {
            let (host, port) = endpoint.rsplit_once(':').unwrap_or((endpoint, ""));
            let port = port
                .parse::<u16>()
                .ok()
                .and_then(|port| port.checked_add(rank))
                .ok_or_else(|| format!("{endpoint}: no port for data-parallel rank {rank}"))?;
            Ok::<_, String>(format!("{host}:{port}"))
        };
        Ok(KvEventsEndpoint {
            publisher: offset(&self.publisher)?,
            replay: self.replay.as_deref().map(offset).transpose()?,
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
    fn grpc_urls_are_workers_with_their_port() {
        let url = WorkerUrl::parse("grpc://127.0.0.1:50051").unwrap();
        assert_eq!(url.protocol, WorkerProtocol::Grpc(None));
        assert_eq!((url.host.as_str(), url.port), ("127.0.0.1", 50051));
        assert_eq!(
            WorkerUrl::parse("GRPC://Worker-1:50051/")
                .unwrap()
                .canonical(),
            "grpc://worker-1:50051"
        );
        let http = WorkerUrl::parse("http://a:8000").unwrap();
        assert_eq!(http.protocol, WorkerProtocol::Http);
        assert_eq!(
            WorkerUrl::parse("grpc://a"),
            Err(UrlError::GrpcPort("grpc://a".into()))
        );
        assert!(matches!(
            WorkerUrl::parse("grpcs://a:1"),
            Err(UrlError::Scheme(_))
        ));
        assert!(matches!(
            WorkerUrl::parse("grpc://a:1/x"),
            Err(UrlError::Path(_))
        ));
        let spec = WorkerSpec::resolve("grpc://127.0.0.1:50051").unwrap();
        assert_eq!(spec.protocol, WorkerProtocol::Grpc(None));
        assert_eq!(GrpcBackend::parse("vllm"), Some(GrpcBackend::Vllm));
        assert_eq!(GrpcBackend::parse("trtllm"), None);
    }

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
    fn https_urls_keep_their_scheme_and_default_to_port_443() {
        let url = WorkerUrl::parse("HTTPS://Worker-1.local/").unwrap();
        assert_eq!((url.scheme, url.port), (Scheme::Https, 443));
        assert_eq!(url.canonical(), "https://worker-1.local");
        assert_eq!(WorkerUrl::parse("https://[::1]:8443").unwrap().port, 8443);
        assert_eq!(WorkerUrl::parse("http://a").unwrap().scheme, Scheme::Http);
        let spec = WorkerSpec::resolve("https://127.0.0.1:31002/").unwrap();
        assert_eq!(spec.scheme, Scheme::Https);
        // The worker's identity is its URL as given, scheme included.
        assert_eq!(spec.url, "https://127.0.0.1:31002/");
        assert_eq!(spec.normalized_url(), "https://127.0.0.1:31002");
        assert_eq!(spec.host(), "127.0.0.1");
        assert_eq!(authority_host("[::1]:8443"), "::1");
    }

    #[test]
    fn bad_urls_say_what_is_wrong() {
        type Expected = fn(&UrlError) -> bool;
        let cases: &[(&str, Expected)] = &[
            ("ftp://a:1", |e| matches!(e, UrlError::Scheme(_))),
            ("https:/a:1", |e| matches!(e, UrlError::Scheme(_))),
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

    #[test]
    fn data_parallel_ranks_publish_at_consecutive_ports() {
        let parse = |text| KvEventsSource::parse(text, "10.0.0.7");
        let Ok(KvEventsSource::Ranks { endpoint, dp_size }) =
            parse("tcp://*:5557+tcp://*:5600?dp_size=3")
        else {
            panic!("three ranks");
        };
        assert_eq!(dp_size, 3);
        let last = endpoint.rank(2).unwrap();
        assert_eq!(last.publisher, "tcp://10.0.0.7:5559");
        assert_eq!(last.replay.as_deref(), Some("tcp://10.0.0.7:5602"));
        let v6 = KvEventsSource::parse("tcp://[::1]:7?dp_size=2", "h").unwrap();
        let KvEventsSource::Ranks { endpoint, .. } = v6 else {
            panic!("two ranks");
        };
        assert_eq!(endpoint.rank(1).unwrap().publisher, "tcp://[::1]:8");
        // One rank is the plain endpoint; a rank past the last port, or no endpoint, is refused.
        assert_eq!(
            parse("tcp://h:1?dp_size=1"),
            Ok(KvEventsSource::At(KvEventsEndpoint {
                publisher: "tcp://h:1".into(),
                replay: None,
            }))
        );
        for bad in [
            "tcp://h:65535?dp_size=2",
            "tcp://h:1?dp_size=0",
            "tcp://h:1?dp_size=x",
            "tcp://h:1?dp_size=100000",
            "auto?dp_size=2",
        ] {
            assert!(parse(bad).is_err(), "{bad}");
        }
    }
}
