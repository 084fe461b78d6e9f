//! The connector's settings: which modes verify, where roots come from, and how a refusal is
//! told from the network's failure. Handshakes against a real server: `tests/it/tls.rs`.

use super::*;
use std::path::PathBuf;

/// A file of the test's own, `contents` written to it; deleted by the caller.
fn file(contents: &str) -> PathBuf {
    let path = std::env::temp_dir().join(format!(
        "durable-etl-tls-{}.pem",
        uuid::Uuid::new_v4().simple()
    ));
    std::fs::write(&path, contents).unwrap();
    path
}

/// A CA certificate, PEM.
fn ca_pem() -> String {
    let key = rcgen::KeyPair::generate().unwrap();
    let mut params = rcgen::CertificateParams::new(Vec::<String>::new()).unwrap();
    params.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
    params.self_signed(&key).unwrap().pem()
}

/// What `mode` asks with root certificates `root`.
fn request(mode: SslMode, root: Option<&PathBuf>) -> TlsRequest {
    TlsRequest {
        mode,
        root_cert: root.cloned(),
    }
}

#[test]
fn tls_every_mode_builds_a_connector_from_a_root_file_or_the_systems_roots() {
    let ca = file(&ca_pem());
    for mode in [
        SslMode::Disable,
        SslMode::Prefer,
        SslMode::Require,
        SslMode::VerifyCa,
        SslMode::VerifyFull,
    ] {
        MakeRustls::new(&request(mode, Some(&ca))).unwrap();
        // No root file: the system's roots (Debian's ca-certificates) for the verifying modes.
        MakeRustls::new(&request(mode, None)).unwrap();
    }
    std::fs::remove_file(ca).unwrap();
}

#[test]
fn tls_root_certificates_that_cannot_be_read_are_a_configuration_error() {
    let missing = std::env::temp_dir().join("durable-etl-no-such-root.pem");
    let not_pem = file("no certificate here\n");
    let broken = file("-----BEGIN CERTIFICATE-----\n!!!!\n-----END CERTIFICATE-----\n");
    let not_a_cert = file("-----BEGIN CERTIFICATE-----\nAAAA\n-----END CERTIFICATE-----\n");
    for root in [&missing, &not_pem, &broken, &not_a_cert] {
        for mode in [SslMode::Require, SslMode::VerifyCa, SslMode::VerifyFull] {
            assert_eq!(
                MakeRustls::new(&request(mode, Some(root))).err(),
                Some(ConfigError::SslRootCert),
                "{mode:?} {root:?}"
            );
        }
        // Modes that verify nothing never read it.
        MakeRustls::new(&request(SslMode::Prefer, Some(root))).unwrap();
    }
    for path in [not_pem, broken, not_a_cert] {
        std::fs::remove_file(path).unwrap();
    }
}

#[test]
fn tls_a_host_that_is_no_name_is_checked_as_an_address_no_certificate_names() {
    let mut tls = MakeRustls::unverified();
    assert!(format!("{tls:?}").starts_with("MakeRustls"));
    let named = tls.make_tls_connect("db.example").unwrap();
    assert_eq!(named.name, ServerName::try_from("db.example").unwrap());
    let nameless = tls.make_tls_connect("").unwrap();
    assert_eq!(
        nameless.name,
        ServerName::from(std::net::IpAddr::from([0, 0, 0, 0]))
    );
}

#[test]
fn tls_a_handshake_rustls_refused_is_told_from_one_the_network_cut() {
    let refused = io::Error::new(
        io::ErrorKind::InvalidData,
        rustls::Error::InvalidCertificate(CertificateError::UnknownIssuer),
    );
    assert!(refused_by_rustls(&refused));
    assert!(!refused_by_rustls(&io::Error::from(
        io::ErrorKind::ConnectionReset
    )));
    assert!(!refused_by_rustls(&io::Error::other("not rustls")));
    let shown = TlsRefused(refused).to_string();
    assert_eq!(shown, "the TLS handshake was refused");
}
