//! TLS to PostgreSQL: the one connector ([`MakeRustls`]) every connection of this crate is
//! opened with (pools, claim and commit sessions, the liveness session, the notifier, one-off
//! clients, cancel requests), built on rustls with the `ring` provider.
//!
//! Why our own `MakeTlsConnect` over `tokio-rustls` rather than the `tokio-postgres-rustls`
//! crate: `tokio-rustls` is the rustls project's own, released with rustls itself, while the
//! adapter is a one-maintainer wrapper of the same hundred lines; and we need what it does not
//! give anyway: libpq's `verify-ca` (the chain checked, not the name) and a refused certificate
//! told apart from a lost connection, so start-up stops at once instead of retrying.
//!
//! Invariants this module keeps:
//! - What is verified follows libpq ([`SslMode`]): `prefer` and `require` encrypt without
//!   checking the certificate, unless `require` is given a root certificate (then as
//!   `verify-ca`); `verify-ca` checks the chain up to the root certificates (the `sslrootcert`
//!   file, else the system's); `verify-full` checks the chain and that the certificate names
//!   the host connected to. The handshake's own signatures are always checked.
//! - A handshake that rustls refused (an untrusted or misnamed certificate, no common protocol)
//!   fails with [`TlsRefused`], which is no I/O error: callers see [`Error::Refused`], never
//!   retried. A handshake cut by the network stays an I/O error, retried as any lost
//!   connection.
//! - Cancel requests ([`MakeRustls::unverified`]) are encrypted when the session's `sslmode`
//!   asks for TLS but never verify the certificate, as libpq before 17 sent them in plaintext:
//!   they carry only a backend's pid and cancel key.
//!
//! [`Error::Refused`]: crate::error::Error::Refused

use crate::config::tls::{SslMode, TlsRequest};
use crate::config::ConfigError;
use std::future::Future;
use std::io;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio_postgres::tls::{ChannelBinding, MakeTlsConnect, TlsConnect};
use tokio_postgres::Socket;
use tokio_rustls::rustls;
use tokio_rustls::rustls::client::danger::{
    HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier,
};
use tokio_rustls::rustls::client::WebPkiServerVerifier;
use tokio_rustls::rustls::crypto::{CryptoProvider, WebPkiSupportedAlgorithms};
use tokio_rustls::rustls::pki_types::pem::PemObject;
use tokio_rustls::rustls::pki_types::{CertificateDer, ServerName, UnixTime};
use tokio_rustls::rustls::{CertificateError, ClientConfig, DigitallySignedStruct, RootCertStore};

/// Opens TLS sessions to PostgreSQL for tokio-postgres, verifying what the URL's `sslmode`
/// asks (see the module's invariants). Cheap to clone.
#[derive(Clone)]
pub struct MakeRustls {
    /// The rustls settings, verifier included.
    config: Arc<ClientConfig>,
}

impl std::fmt::Debug for MakeRustls {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("MakeRustls").finish_non_exhaustive()
    }
}

impl MakeRustls {
    /// The connector for what `request` asks.
    ///
    /// # Errors
    /// [`ConfigError::SslRootCert`] when a verifying mode's root certificates cannot be read
    /// (a missing or empty file; no system roots).
    pub fn new(request: &TlsRequest) -> Result<MakeRustls, ConfigError> {
        let chain = match (request.mode, &request.root_cert) {
            (SslMode::Disable | SslMode::Prefer, _) | (SslMode::Require, None) => None,
            (SslMode::Require | SslMode::VerifyCa, root) => Some((roots(root.as_deref())?, false)),
            (SslMode::VerifyFull, root) => Some((roots(root.as_deref())?, true)),
        };
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let verifier = match chain {
            None => Verifier {
                chain: None,
                name: false,
                algorithms: provider.signature_verification_algorithms,
            },
            Some((roots, name)) => Verifier {
                chain: Some(
                    WebPkiServerVerifier::builder_with_provider(Arc::new(roots), provider.clone())
                        .build()
                        .map_err(|_| ConfigError::SslRootCert)?,
                ),
                name,
                algorithms: provider.signature_verification_algorithms,
            },
        };
        Ok(MakeRustls::with(provider, verifier))
    }

    /// The connector of cancel requests: TLS without verification (see the module's
    /// invariants).
    pub fn unverified() -> MakeRustls {
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let verifier = Verifier {
            chain: None,
            name: false,
            algorithms: provider.signature_verification_algorithms,
        };
        MakeRustls::with(provider, verifier)
    }

    /// A connector of `provider` verifying with `verifier`, offering ALPN `postgresql` (which
    /// PostgreSQL 17's direct TLS negotiation requires, and older servers ignore).
    fn with(provider: Arc<CryptoProvider>, verifier: Verifier) -> MakeRustls {
        let mut config = ClientConfig::builder_with_provider(provider)
            .with_protocol_versions(rustls::DEFAULT_VERSIONS)
            .unwrap_or_else(|_| ClientConfig::builder())
            .dangerous()
            .with_custom_certificate_verifier(Arc::new(verifier))
            .with_no_client_auth();
        config.alpn_protocols = vec![b"postgresql".to_vec()];
        MakeRustls {
            config: Arc::new(config),
        }
    }
}

/// The root certificates of the PEM file `path`, else the system's.
///
/// # Errors
/// [`ConfigError::SslRootCert`] when none can be read.
fn roots(path: Option<&std::path::Path>) -> Result<RootCertStore, ConfigError> {
    let certs: Vec<CertificateDer<'static>> = match path {
        Some(path) => CertificateDer::pem_file_iter(path)
            .map_err(|_| ConfigError::SslRootCert)?
            .collect::<Result<_, _>>()
            .map_err(|_| ConfigError::SslRootCert)?,
        None => rustls_native_certs::load_native_certs().certs,
    };
    let mut roots = RootCertStore::empty();
    let (added, _unparsable) = roots.add_parsable_certificates(certs);
    match added {
        0 => Err(ConfigError::SslRootCert),
        _ => Ok(roots),
    }
}

/// Checks a server's certificate as the connector's mode asks.
#[derive(Debug)]
struct Verifier {
    /// The chain's verifier against the root certificates; `None`: the certificate is not
    /// checked.
    chain: Option<Arc<WebPkiServerVerifier>>,
    /// Whether the certificate must name the host (`verify-full`).
    name: bool,
    /// The signature algorithms the handshake's signatures are checked with.
    algorithms: WebPkiSupportedAlgorithms,
}

impl ServerCertVerifier for Verifier {
    fn verify_server_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        intermediates: &[CertificateDer<'_>],
        server_name: &ServerName<'_>,
        ocsp_response: &[u8],
        now: UnixTime,
    ) -> Result<ServerCertVerified, rustls::Error> {
        let Some(chain) = &self.chain else {
            return Ok(ServerCertVerified::assertion());
        };
        // webpki checks the chain first and the name last: a name error means the chain held.
        match chain.verify_server_cert(end_entity, intermediates, server_name, ocsp_response, now) {
            Err(rustls::Error::InvalidCertificate(
                CertificateError::NotValidForName | CertificateError::NotValidForNameContext { .. },
            )) if !self.name => Ok(ServerCertVerified::assertion()),
            checked => checked,
        }
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls12_signature(message, cert, dss, &self.algorithms)
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls13_signature(message, cert, dss, &self.algorithms)
    }

    fn supported_verify_schemes(&self) -> Vec<rustls::SignatureScheme> {
        self.algorithms.supported_schemes()
    }
}

impl MakeTlsConnect<Socket> for MakeRustls {
    type Stream = RustlsStream;
    type TlsConnect = RustlsConnect;
    type Error = std::convert::Infallible;

    fn make_tls_connect(&mut self, domain: &str) -> Result<RustlsConnect, Self::Error> {
        // A host that is no DNS name nor IP address (none: a `hostaddr` alone) is checked as the
        // unspecified address, which no certificate names: `verify-full` refuses it.
        let name = ServerName::try_from(domain.to_owned())
            .unwrap_or(ServerName::from(std::net::Ipv4Addr::UNSPECIFIED));
        Ok(RustlsConnect {
            connector: tokio_rustls::TlsConnector::from(Arc::clone(&self.config)),
            name,
        })
    }
}

/// Opens one TLS session to one host ([`MakeRustls`]).
pub struct RustlsConnect {
    /// The rustls connector.
    connector: tokio_rustls::TlsConnector,
    /// The host's name, as its certificate must give it for `verify-full`.
    name: ServerName<'static>,
}

impl TlsConnect<Socket> for RustlsConnect {
    type Stream = RustlsStream;
    type Error = Box<dyn std::error::Error + Send + Sync>;
    type Future = Pin<Box<dyn Future<Output = Result<RustlsStream, Self::Error>> + Send>>;

    fn connect(self, stream: Socket) -> Self::Future {
        Box::pin(async move {
            match self.connector.connect(self.name, stream).await {
                Ok(stream) => Ok(RustlsStream(Box::new(stream))),
                Err(e) if refused_by_rustls(&e) => Err(Box::new(TlsRefused(e)) as Self::Error),
                Err(e) => Err(Box::new(e) as Self::Error),
            }
        })
    }
}

/// Whether a failed handshake's error is rustls's refusal rather than the network's.
fn refused_by_rustls(e: &io::Error) -> bool {
    e.get_ref().is_some_and(|inner| inner.is::<rustls::Error>())
}

/// A TLS handshake rustls refused: an untrusted or misnamed certificate, or no protocol both
/// sides speak. Retrying cannot fix it.
#[derive(Debug, thiserror::Error)]
#[error("the TLS handshake was refused")]
pub struct TlsRefused(#[source] io::Error);

/// A TLS session to PostgreSQL ([`MakeRustls`]).
pub struct RustlsStream(Box<tokio_rustls::client::TlsStream<Socket>>);

impl AsyncRead for RustlsStream {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        Pin::new(&mut *self.0).poll_read(cx, buf)
    }
}

impl AsyncWrite for RustlsStream {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut *self.0).poll_write(cx, buf)
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut *self.0).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut *self.0).poll_shutdown(cx)
    }
}

impl tokio_postgres::tls::TlsStream for RustlsStream {
    /// No channel binding: SCRAM runs without `-PLUS` over these sessions (as the driver does
    /// over a plaintext one), so `channel_binding=require` is refused.
    fn channel_binding(&self) -> ChannelBinding {
        ChannelBinding::none()
    }
}

#[cfg(test)]
mod tests;
