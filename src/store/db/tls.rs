//! TLS to PostgreSQL, as libpq's `sslmode` and `sslrootcert` say, over rustls with ring's
//! cryptography (no system OpenSSL): the settings a connection is made with, and
//! [`connect_client`], which makes every one of them.
//!
//! | `sslmode` | TLS | what is verified |
//! |---|---|---|
//! | `disable` | never | |
//! | `allow` | only when the server refuses a plain connection | nothing |
//! | `prefer` (the default) | when the server offers it; plain when it refuses TLS | nothing |
//! | `require` | always | nothing, or the chain as `verify-ca` when a root file exists |
//! | `verify-ca` | always | the chain, up to `sslrootcert` |
//! | `verify-full` | always | the chain, and that the certificate names the host |
//!
//! `sslrootcert` is a PEM file (libpq's default `~/.postgresql/root.crt`), or `system` for the
//! system's roots (which, as in libpq, requires `verify-full`). A Unix socket never uses TLS.

use std::fmt;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use rustls::client::WebPkiServerVerifier;
use rustls::client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier};
use rustls::crypto::CryptoProvider;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, ServerName, UnixTime};
use rustls::{CertificateError, DigitallySignedStruct, RootCertStore, SignatureScheme};
use tokio_postgres_rustls::MakeRustlsConnect;

use crate::error::{Error, Result};

/// libpq's `sslmode`: whether a connection uses TLS, and what it verifies.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub(crate) enum SslMode {
    /// Plain connections only.
    Disable,
    /// Plain first; TLS (unverified) when the server refuses the plain connection.
    Allow,
    /// TLS (unverified) first; plain when the server offers no TLS or refuses the TLS
    /// connection.
    Prefer,
    /// TLS, unverified unless a root certificate file exists (then as [`SslMode::VerifyCa`]).
    Require,
    /// TLS, with the server's chain verified up to the root certificates.
    VerifyCa,
    /// TLS, with the chain verified and the certificate valid for the host name.
    VerifyFull,
}

impl SslMode {
    /// Reads libpq's spelling.
    ///
    /// # Errors
    ///
    /// [`Error::Invalid`] for any other text.
    pub(crate) fn parse(text: &str) -> Result<SslMode> {
        Ok(match text {
            "disable" => SslMode::Disable,
            "allow" => SslMode::Allow,
            "prefer" => SslMode::Prefer,
            "require" => SslMode::Require,
            "verify-ca" => SslMode::VerifyCa,
            "verify-full" => SslMode::VerifyFull,
            other => {
                return Err(Error::Invalid {
                    setting: "sslmode",
                    reason: format!(
                        "{other:?} is none of disable, allow, prefer, require, verify-ca, \
                         verify-full"
                    ),
                });
            }
        })
    }
}

/// What each connection to one database is made with: the `postgres` crate's settings, and
/// leasehold's TLS ones (which that crate does not parse).
#[derive(Clone)]
pub(crate) struct Settings {
    pg: postgres::Config,
    mode: SslMode,
    /// The TLS client, with the verifier `mode` and the root certificates ask for; `None`
    /// when no connection may use TLS.
    tls: Option<MakeRustlsConnect>,
}

impl fmt::Debug for Settings {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // postgres::Config's Debug shows the password as `_`; the TLS client has no Debug.
        f.debug_struct("Settings")
            .field("pg", &self.pg)
            .field("mode", &self.mode)
            .finish_non_exhaustive()
    }
}

impl Settings {
    /// The `postgres` crate's settings, to add what bounds a session's waits to.
    pub(crate) fn pg_mut(&mut self) -> &mut postgres::Config {
        &mut self.pg
    }

    /// The settings for `mode` and `root_cert` (`sslrootcert`: a file, or `system`; `None`
    /// for libpq's default, `~/.postgresql/root.crt`, used when it exists). The root
    /// certificates are read here, once: a connection made again later uses the same.
    ///
    /// # Errors
    ///
    /// [`Error::Invalid`] when `verify-ca` or `verify-full` has no root certificate file, the
    /// file holds no certificate, or `system` is asked with a mode weaker than `verify-full`;
    /// [`Error::Io`] when the file cannot be read.
    pub(crate) fn new(
        pg: postgres::Config,
        mode: SslMode,
        root_cert: Option<&str>,
    ) -> Result<Settings> {
        let unix_only = pg
            .get_hosts()
            .iter()
            .all(|h| matches!(h, postgres::config::Host::Unix(_)));
        // libpq: "sslmode is ignored for Unix domain socket communication".
        let mode = if unix_only && !pg.get_hosts().is_empty() {
            SslMode::Disable
        } else {
            mode
        };
        let tls = match mode {
            SslMode::Disable => None,
            _ => Some(client(mode, root_cert)?),
        };
        Ok(Settings { pg, mode, tls })
    }
}

/// The TLS client for `mode`: its verifier, and the root certificates that one checks against.
fn client(mode: SslMode, root_cert: Option<&str>) -> Result<MakeRustlsConnect> {
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let invalid = |reason: String| Error::Invalid {
        setting: "sslrootcert",
        reason,
    };
    let roots = match root_cert {
        Some("system") if mode < SslMode::VerifyFull => {
            return Err(invalid(format!(
                "the system's roots need sslmode=verify-full (libpq's rule), not {mode:?}"
            )));
        }
        Some("system") => Some(system_roots().ok_or_else(|| {
            invalid("no system root certificates found (set SSL_CERT_FILE)".to_string())
        })?),
        Some(file) => Some(PathBuf::from(file)),
        None => default_root(),
    };
    // libpq verifies the chain under `require` too when the root file exists; a missing file
    // leaves `require` (and weaker) unverified, and fails the verifying modes.
    let roots = match roots {
        Some(path) if path.exists() && mode >= SslMode::Require => Some(read_roots(&path)?),
        Some(path) if mode >= SslMode::VerifyCa => {
            return Err(invalid(format!(
                "the root certificate file {} does not exist: sslmode={} verifies the server \
                 against it (give sslrootcert, or use sslmode=require, which does not verify)",
                path.display(),
                if mode == SslMode::VerifyCa {
                    "verify-ca"
                } else {
                    "verify-full"
                }
            )));
        }
        None if mode >= SslMode::VerifyCa => {
            return Err(invalid(
                "no root certificate file: give sslrootcert, as sslmode verify-ca and \
                 verify-full verify the server against it"
                    .to_string(),
            ));
        }
        _ => None,
    };
    let verifier: Arc<dyn ServerCertVerifier> = match roots {
        None => Arc::new(Unverified(provider.clone())),
        Some(roots) => {
            let chain =
                WebPkiServerVerifier::builder_with_provider(Arc::new(roots), provider.clone())
                    .build()
                    .map_err(|e| invalid(format!("cannot verify with these roots: {e}")))?;
            if mode == SslMode::VerifyFull {
                chain
            } else {
                Arc::new(ChainOnly(chain))
            }
        }
    };
    let config = rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .map_err(|e| invalid(format!("no TLS version: {e}")))?
        .dangerous()
        .with_custom_certificate_verifier(verifier)
        .with_no_client_auth();
    Ok(MakeRustlsConnect::new(config))
}

/// libpq's default root file, `~/.postgresql/root.crt`.
fn default_root() -> Option<PathBuf> {
    let home = std::env::var_os("HOME").filter(|h| !h.is_empty())?;
    Some(PathBuf::from(home).join(".postgresql/root.crt"))
}

/// The system's bundle of root certificates: `SSL_CERT_FILE`, else the first that exists of
/// the distributions' usual places (OpenSSL's own default).
fn system_roots() -> Option<PathBuf> {
    if let Some(file) = std::env::var_os("SSL_CERT_FILE").filter(|f| !f.is_empty()) {
        return Some(PathBuf::from(file));
    }
    [
        "/etc/ssl/certs/ca-certificates.crt",
        "/etc/pki/tls/certs/ca-bundle.crt",
        "/etc/ssl/ca-bundle.pem",
        "/etc/ssl/cert.pem",
    ]
    .into_iter()
    .map(PathBuf::from)
    .find(|p| p.exists())
}

/// The certificates of the PEM file at `path`.
fn read_roots(path: &Path) -> Result<RootCertStore> {
    let mut roots = RootCertStore::empty();
    let certs = CertificateDer::pem_file_iter(path).map_err(|e| {
        Error::io(
            format!("cannot read the root certificates {}", path.display()),
            std::io::Error::other(e),
        )
    })?;
    for cert in certs {
        let cert = cert.map_err(|e| Error::Invalid {
            setting: "sslrootcert",
            reason: format!("{}: {e}", path.display()),
        })?;
        roots.add(cert).map_err(|e| Error::Invalid {
            setting: "sslrootcert",
            reason: format!("{}: {e}", path.display()),
        })?;
    }
    if roots.is_empty() {
        return Err(Error::Invalid {
            setting: "sslrootcert",
            reason: format!("{} holds no certificate", path.display()),
        });
    }
    Ok(roots)
}

/// Connects with `settings`: the one place a connection to PostgreSQL is made (a store's, a
/// store's again after a lost one, a runner's listening one). Blocks: call it as the
/// `postgres` crate's calls are called (see `pg::blocking`).
///
/// # Errors
///
/// [`Error::Postgres`] when the server cannot be reached, refuses the connection (its
/// message says why: `no pg_hba.conf entry ... no encryption` for a plain connection to a
/// server that requires TLS), offers no TLS where it is required, or shows a certificate that
/// does not verify (`invalid peer certificate: ...`).
pub(crate) fn connect_client(settings: &Settings) -> Result<postgres::Client> {
    use postgres::config::SslMode as Negotiate;
    let plain = || -> Result<postgres::Client> {
        let mut pg = settings.pg.clone();
        pg.ssl_mode(Negotiate::Disable);
        Ok(pg.connect(postgres::NoTls)?)
    };
    let Some(tls) = &settings.tls else {
        return plain();
    };
    let secure = |negotiate| -> Result<postgres::Client> {
        let mut pg = settings.pg.clone();
        pg.ssl_mode(negotiate);
        Ok(pg.connect(tls.clone())?)
    };
    // The server answered, and refused: its pg_hba.conf may take the other kind. When both
    // fail, the TLS attempt's error says why (a wrong password, rather than the plain
    // attempt's "no encryption").
    let refused = |e: &Error| matches!(e, Error::Postgres(e) if e.as_db_error().is_some());
    match settings.mode {
        SslMode::Disable => plain(),
        SslMode::Allow => match plain() {
            Err(e) if refused(&e) => secure(Negotiate::Require),
            other => other,
        },
        // The postgres crate itself goes on in plain text when the server offers no TLS.
        SslMode::Prefer => match secure(Negotiate::Prefer) {
            Err(e) if refused(&e) => plain().map_err(|_| e),
            other => other,
        },
        SslMode::Require | SslMode::VerifyCa | SslMode::VerifyFull => secure(Negotiate::Require),
    }
}

/// Accepts any certificate (`prefer`, `require` without roots, as libpq): the connection is
/// encrypted, and the handshake's signatures are still checked against the certificate shown.
#[derive(Debug)]
struct Unverified(Arc<CryptoProvider>);

impl ServerCertVerifier for Unverified {
    fn verify_server_cert(
        &self,
        _: &CertificateDer<'_>,
        _: &[CertificateDer<'_>],
        _: &ServerName<'_>,
        _: &[u8],
        _: UnixTime,
    ) -> std::result::Result<ServerCertVerified, rustls::Error> {
        Ok(ServerCertVerified::assertion())
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> std::result::Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls12_signature(
            message,
            cert,
            dss,
            &self.0.signature_verification_algorithms,
        )
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> std::result::Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls13_signature(
            message,
            cert,
            dss,
            &self.0.signature_verification_algorithms,
        )
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.0.signature_verification_algorithms.supported_schemes()
    }
}

/// `verify-ca`: the chain up to the roots, its dates and usage, but not the host name. The
/// web PKI verifier checks the name last, after the chain: a name error means the rest held.
#[derive(Debug)]
struct ChainOnly(Arc<WebPkiServerVerifier>);

impl ServerCertVerifier for ChainOnly {
    fn verify_server_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        intermediates: &[CertificateDer<'_>],
        server_name: &ServerName<'_>,
        ocsp: &[u8],
        now: UnixTime,
    ) -> std::result::Result<ServerCertVerified, rustls::Error> {
        match self
            .0
            .verify_server_cert(end_entity, intermediates, server_name, ocsp, now)
        {
            Err(rustls::Error::InvalidCertificate(
                CertificateError::NotValidForName | CertificateError::NotValidForNameContext { .. },
            )) => Ok(ServerCertVerified::assertion()),
            other => other,
        }
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> std::result::Result<HandshakeSignatureValid, rustls::Error> {
        self.0.verify_tls12_signature(message, cert, dss)
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> std::result::Result<HandshakeSignatureValid, rustls::Error> {
        self.0.verify_tls13_signature(message, cert, dss)
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.0.supported_verify_schemes()
    }
}
