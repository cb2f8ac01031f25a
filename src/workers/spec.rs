//! A worker's address: the one parser of worker URLs, used by `--worker-urls`, the admin API's
//! `POST /workers` and `DELETE /workers/{url}` alike, so a URL means the same thing everywhere.
//!
//! Owns [`WorkerUrl`] (the syntax: `http://host[:port][/]`, port 80 when absent, nothing else)
//! and [`WorkerSpec`] (a worker as the gateway uses it: the URL exactly as given, which is the
//! `x-smg-routed-worker-id` value, its resolved address and its `Host` header value). A URL that
//! cannot be used is a [`UrlError`] saying why.

use std::net::{SocketAddr, ToSocketAddrs};

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
        let rest = url
            .strip_prefix("http://")
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

    /// The first address the host resolves to (a DNS lookup for a name: call off the data path).
    pub fn resolve(&self) -> Result<SocketAddr, UrlError> {
        let fail = |why: String| UrlError::Resolve(self.authority.clone(), why);
        (self.host.as_str(), self.port)
            .to_socket_addrs()
            .map_err(|e| fail(e.to_string()))?
            .next()
            .ok_or_else(|| fail("no address".to_string()))
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
    /// The resolved address the gateway connects to.
    pub addr: SocketAddr,
    /// `host:port` as written in the URL, for the upstream `Host` header.
    pub authority: String,
}

impl WorkerSpec {
    /// Parses `url` and resolves its host.
    pub fn resolve(url: &str) -> Result<WorkerSpec, UrlError> {
        let parsed = WorkerUrl::parse(url)?;
        Ok(WorkerSpec {
            url: url.to_string(),
            addr: parsed.resolve()?,
            authority: parsed.authority,
        })
    }

    /// The URL without a trailing `/`: two spellings of one worker compare equal this way.
    pub fn normalized_url(&self) -> &str {
        self.url.trim_end_matches('/')
    }
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
