//! The TLS flags (SMG's names, under SMG's "TLS/mTLS Security" heading) and the rustls
//! configurations they build, once, at start: [`TlsArgs`] as clap parses them, [`TlsConfig`]
//! checked. `--tls-cert-path`/`--tls-key-path` make the data port speak HTTPS (the metrics port
//! stays plain, as SMG's does); `--ca-cert-paths` and `--client-cert-path`/`--client-key-path`
//! (SMG's launcher's flags) say how `https://` workers are checked and whom they see.
//!
//! Every file is read and parsed here, so a missing file, a file without PEM blocks, or a key
//! that is not the certificate's refuses the start with a `FlagError` naming the flag and the
//! file. The I/O that uses these configurations is `net::tls`.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use clap::Args;
use rustls::crypto::CryptoProvider;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use rustls::{ClientConfig, RootCertStore, ServerConfig};

use crate::error::FlagError;
use crate::limits::TLS_HANDSHAKE_TIMEOUT;

/// The one protocol the gateway speaks over TLS, offered and accepted by ALPN.
const ALPN_HTTP1: &[u8] = b"http/1.1";

/// The TLS flags, as clap parses them.
#[derive(Args, Clone, Debug)]
pub struct TlsArgs {
    /// Path to the gateway's TLS certificate chain (PEM, the gateway's own certificate first):
    /// with --tls-key-path, the data port accepts HTTPS only (HTTP/1.1 by ALPN). The metrics
    /// port stays plain HTTP.
    #[arg(
        help_heading = "TLS/mTLS Security",
        long = "tls-cert-path",
        value_name = "PATH",
        requires = "tls_key_path"
    )]
    pub tls_cert_path: Option<PathBuf>,
    /// Path to the private key of --tls-cert-path's certificate (PEM: PKCS#8, PKCS#1 or SEC1).
    #[arg(
        help_heading = "TLS/mTLS Security",
        long = "tls-key-path",
        value_name = "PATH",
        requires = "tls_cert_path"
    )]
    pub tls_key_path: Option<PathBuf>,
    /// CA certificates (PEM) trusted for https:// workers, besides the system's roots; several
    /// paths may follow the flag (--ca-cert-path is the same flag).
    #[arg(
        help_heading = "TLS/mTLS Security",
        long = "ca-cert-paths",
        visible_alias = "ca-cert-path",
        value_name = "PATH",
        num_args = 1..
    )]
    pub ca_cert_paths: Vec<PathBuf>,
    /// Client certificate chain (PEM) shown to https:// workers that ask for one (mTLS).
    #[arg(
        help_heading = "TLS/mTLS Security",
        long = "client-cert-path",
        value_name = "PATH",
        requires = "client_key_path"
    )]
    pub client_cert_path: Option<PathBuf>,
    /// Private key (PEM) of --client-cert-path's certificate.
    #[arg(
        help_heading = "TLS/mTLS Security",
        long = "client-key-path",
        value_name = "PATH",
        requires = "client_cert_path"
    )]
    pub client_key_path: Option<PathBuf>,
    /// Milliseconds a client has to finish its TLS handshake on the data port.
    #[arg(help_heading = "TLS/mTLS Security", long = "tls-handshake-timeout-ms", hide = true, default_value_t = TLS_HANDSHAKE_TIMEOUT.as_millis() as u64)]
    pub tls_handshake_timeout_ms: u64,
}

/// The checked TLS configuration.
#[derive(Clone, Debug)]
pub struct TlsConfig {
    /// The data port's TLS (`--tls-cert-path`); `None`: plain HTTP.
    pub server: Option<Arc<ServerConfig>>,
    /// How connections to `https://` workers are made and checked.
    pub upstream: Arc<ClientConfig>,
    /// How long a client has to finish its handshake.
    pub handshake_timeout: Duration,
}

impl TlsArgs {
    /// Reads the files the flags name and builds the configurations.
    pub fn config(&self) -> Result<TlsConfig, FlagError> {
        let server = match (&self.tls_cert_path, &self.tls_key_path) {
            (Some(cert), Some(key)) => Some(Arc::new(server_config(cert, key)?)),
            (None, None) => None,
            // clap's `requires` refuses one without the other first.
            _ => {
                return Err(FlagError::new(
                    "--tls-cert-path",
                    "--tls-cert-path and --tls-key-path go together",
                ))
            }
        };
        let client_auth = match (&self.client_cert_path, &self.client_key_path) {
            (Some(cert), Some(key)) => Some((
                read_certs("--client-cert-path", cert)?,
                read_key("--client-key-path", key)?,
            )),
            (None, None) => None,
            _ => {
                return Err(FlagError::new(
                    "--client-cert-path",
                    "--client-cert-path and --client-key-path go together",
                ))
            }
        };
        let mut roots = system_roots();
        for path in &self.ca_cert_paths {
            for cert in read_certs("--ca-cert-paths", path)? {
                roots.add(cert).map_err(|e| {
                    let reason = format!("{}: not a CA certificate: {e}", path.display());
                    FlagError::new("--ca-cert-paths", reason)
                })?;
            }
        }
        let upstream = upstream_config(roots, client_auth).map_err(|e| {
            FlagError::new(
                "--client-key-path",
                format!("does not fit the certificate: {e}"),
            )
        })?;
        if self.tls_handshake_timeout_ms == 0 {
            return Err(FlagError::new(
                "--tls-handshake-timeout-ms",
                "must be at least 1",
            ));
        }
        Ok(TlsConfig {
            server,
            upstream: Arc::new(upstream),
            handshake_timeout: Duration::from_millis(self.tls_handshake_timeout_ms),
        })
    }
}

/// The cryptography behind every TLS connection: rustls' `aws-lc-rs` provider.
fn provider() -> Arc<CryptoProvider> {
    Arc::new(rustls::crypto::aws_lc_rs::default_provider())
}

/// The data port's configuration: the certificate chain in `cert_path` with the key in
/// `key_path`, which must be its certificate's key; HTTP/1.1 by ALPN.
fn server_config(cert_path: &Path, key_path: &Path) -> Result<ServerConfig, FlagError> {
    let certs = read_certs("--tls-cert-path", cert_path)?;
    let key = read_key("--tls-key-path", key_path)?;
    let builder = ServerConfig::builder_with_provider(provider())
        .with_safe_default_protocol_versions()
        .map_err(|e| FlagError::new("--tls-cert-path", e.to_string()))?;
    let mut config = builder
        .with_no_client_auth()
        .with_single_cert(certs, key)
        .map_err(|e| {
            let reason = format!(
                "{} is not the key of the certificate in {}: {e}",
                key_path.display(),
                cert_path.display()
            );
            FlagError::new("--tls-key-path", reason)
        })?;
    config.alpn_protocols = vec![ALPN_HTTP1.to_vec()];
    Ok(config)
}

/// The roots of the system's store (`rustls-native-certs`: the files OpenSSL would read,
/// `SSL_CERT_FILE` and `SSL_CERT_DIR` included); certificates it cannot parse are skipped, and
/// a system without a store has none (`--ca-cert-paths` then names the workers' CA).
pub fn system_roots() -> RootCertStore {
    let mut roots = RootCertStore::empty();
    roots.add_parsable_certificates(rustls_native_certs::load_native_certs().certs);
    roots
}

/// The configuration of connections to `https://` workers: certificates checked against
/// `roots`, the client certificate shown when given, HTTP/1.1 by ALPN.
pub fn upstream_config(
    roots: RootCertStore,
    client_auth: Option<(Vec<CertificateDer<'static>>, PrivateKeyDer<'static>)>,
) -> Result<ClientConfig, rustls::Error> {
    let builder = ClientConfig::builder_with_provider(provider())
        .with_safe_default_protocol_versions()?
        .with_root_certificates(roots);
    let mut config = match client_auth {
        Some((certs, key)) => builder.with_client_auth_cert(certs, key)?,
        None => builder.with_no_client_auth(),
    };
    config.alpn_protocols = vec![ALPN_HTTP1.to_vec()];
    Ok(config)
}

/// The PEM certificates in `path` (at least one), or an error naming `flag` and the file.
fn read_certs(flag: &'static str, path: &Path) -> Result<Vec<CertificateDer<'static>>, FlagError> {
    let pem = read_file(flag, path)?;
    let certs = CertificateDer::pem_slice_iter(&pem)
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| FlagError::new(flag, format!("{}: bad PEM: {e}", path.display())))?;
    if certs.is_empty() {
        let reason = format!("{} holds no PEM certificate", path.display());
        return Err(FlagError::new(flag, reason));
    }
    Ok(certs)
}

/// The PEM private key in `path`, or an error naming `flag` and the file.
fn read_key(flag: &'static str, path: &Path) -> Result<PrivateKeyDer<'static>, FlagError> {
    let pem = read_file(flag, path)?;
    PrivateKeyDer::from_pem_slice(&pem).map_err(|e| {
        let reason = format!("{} holds no PEM private key: {e}", path.display());
        FlagError::new(flag, reason)
    })
}

fn read_file(flag: &'static str, path: &Path) -> Result<Vec<u8>, FlagError> {
    std::fs::read(path)
        .map_err(|e| FlagError::new(flag, format!("cannot read {}: {e}", path.display())))
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    #[derive(Parser)]
    struct Flags {
        #[command(flatten)]
        tls: TlsArgs,
    }

    fn config(args: &[&str]) -> Result<TlsConfig, FlagError> {
        let flags = Flags::try_parse_from(std::iter::once("kvgate").chain(args.iter().copied()))
            .map_err(|e| FlagError::new("clap", e.to_string()))?;
        flags.tls.config()
    }

    /// A directory of its own under the system's temporary one, with a certificate and its
    /// key, another certificate's key, and a file without PEM in it.
    fn files() -> PathBuf {
        let dir = std::env::temp_dir().join(format!("kvgate-tls-flags-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let made = rcgen::generate_simple_self_signed(vec!["localhost".into()]).unwrap();
        let other = rcgen::generate_simple_self_signed(vec!["localhost".into()]).unwrap();
        std::fs::write(dir.join("cert.pem"), made.cert.pem()).unwrap();
        std::fs::write(dir.join("key.pem"), made.signing_key.serialize_pem()).unwrap();
        std::fs::write(dir.join("other-key.pem"), other.signing_key.serialize_pem()).unwrap();
        std::fs::write(dir.join("empty.pem"), "no PEM here\n").unwrap();
        dir
    }

    #[test]
    fn files_that_cannot_serve_refuse_the_start_naming_flag_and_file() {
        let dir = files();
        let path = |name: &str| dir.join(name).display().to_string();
        let (cert, key) = (path("cert.pem"), path("key.pem"));
        let ok = config(&["--tls-cert-path", &cert, "--tls-key-path", &key]).unwrap();
        let server = ok.server.expect("the data port speaks TLS");
        assert_eq!(server.alpn_protocols, vec![b"http/1.1".to_vec()]);
        assert!(config(&[]).unwrap().server.is_none());
        let cases = [
            (
                path("missing.pem"),
                key.clone(),
                "--tls-cert-path",
                "missing.pem",
            ),
            (
                path("empty.pem"),
                key.clone(),
                "--tls-cert-path",
                "empty.pem",
            ),
            (
                cert.clone(),
                path("empty.pem"),
                "--tls-key-path",
                "empty.pem",
            ),
            (
                cert.clone(),
                path("other-key.pem"),
                "--tls-key-path",
                "other-key.pem",
            ),
        ];
        for (cert, key, flag, file) in cases {
            let error = config(&["--tls-cert-path", &cert, "--tls-key-path", &key]).unwrap_err();
            assert_eq!(error.flag, flag, "{cert} {key}: {}", error.reason);
            assert!(error.reason.contains(file), "{}", error.reason);
            assert!(!error.reason.contains('\n'), "one line: {}", error.reason);
        }
        // One without the other is clap's refusal.
        let alone = config(&["--tls-cert-path", &cert]).unwrap_err();
        assert_eq!(alone.flag, "clap");
        let bad_ca = config(&["--ca-cert-paths", &path("empty.pem")]).unwrap_err();
        assert_eq!(bad_ca.flag, "--ca-cert-paths");
        let ca = config(&["--ca-cert-paths", &cert, &cert]).unwrap();
        assert_eq!(ca.upstream.alpn_protocols, vec![b"http/1.1".to_vec()]);
        let client = ["--client-cert-path", &cert, "--client-key-path"];
        assert!(config(&[&client[..], &[key.as_str()]].concat()).is_ok());
        let mismatched = config(&[&client[..], &[path("other-key.pem").as_str()]].concat());
        assert_eq!(mismatched.unwrap_err().flag, "--client-key-path");
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn ca_cert_path_is_ca_cert_paths() {
        use clap::Parser;
        let parse = |args: &[&str]| {
            let argv = std::iter::once("kvgate").chain(args.iter().copied());
            Flags::try_parse_from(argv).map(|f| f.tls.ca_cert_paths)
        };
        let one = parse(&["--ca-cert-path", "a.pem"]).unwrap();
        assert_eq!(one, [PathBuf::from("a.pem")]);
        let mixed = parse(&[
            "--ca-cert-path",
            "a.pem",
            "b.pem",
            "--ca-cert-paths",
            "c.pem",
        ]);
        let paths = ["a.pem", "b.pem", "c.pem"].map(PathBuf::from);
        assert_eq!(mixed.unwrap(), paths);
        // Read as --ca-cert-paths is: a file without a certificate is refused under that name.
        // (A file of its own: the test above removes its directory when it ends.)
        let empty =
            std::env::temp_dir().join(format!("kvgate-ca-alias-{}.pem", std::process::id()));
        std::fs::write(&empty, "no PEM here\n").unwrap();
        let error = config(&["--ca-cert-path", &empty.display().to_string()]).unwrap_err();
        assert_eq!(error.flag, "--ca-cert-paths");
        std::fs::remove_file(&empty).unwrap();
    }
}
