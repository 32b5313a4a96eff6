//! HTTPS for emulators of private backends: a Proxmox host answers with a self-signed
//! certificate, a lab backend with one from the company's CA. Each [`TestCa`] is a
//! throwaway private CA made when it is created, with a server certificate it signs for
//! `127.0.0.1` and `localhost`; its PEM is what a providers file's `tls.caFile` names.
//! No system root trusts it, so a test proves the host trusts exactly the bundle it was
//! given.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use rcgen::{BasicConstraints, CertificateParams, CertifiedIssuer, DnType, IsCa, KeyPair};
use rustls::pki_types::{PrivateKeyDer, PrivatePkcs8KeyDer};

/// A private CA and the server configuration of an emulator whose certificate it signed.
pub struct TestCa {
    ca_pem: String,
    server: Arc<rustls::ServerConfig>,
    /// The server certificate and its key, PEM, for servers that read files (a registry).
    server_cert_pem: String,
    server_key_pem: String,
}

impl TestCa {
    /// A new CA (ECDSA P-256, as rcgen makes by default) and a server certificate for
    /// `127.0.0.1` and `localhost`.
    pub fn new() -> TestCa {
        let mut ca_params = CertificateParams::new(Vec::<String>::new()).expect("CA params");
        ca_params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        ca_params.distinguished_name.push(DnType::CommonName, "egress emulator test CA");
        let ca = CertifiedIssuer::self_signed(ca_params, KeyPair::generate().expect("CA key"))
            .expect("self-signed CA");
        let key = KeyPair::generate().expect("server key");
        let mut params = CertificateParams::new(vec!["127.0.0.1".into(), "localhost".into()])
            .expect("server params");
        params.distinguished_name.push(DnType::CommonName, "127.0.0.1");
        let cert = params.signed_by(&key, &ca).expect("server certificate");
        let (server_cert_pem, server_key_pem) = (cert.pem(), key.serialize_pem());
        let key = PrivateKeyDer::Pkcs8(PrivatePkcs8KeyDer::from(key.serialize_der()));
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let server = rustls::ServerConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()
            .expect("TLS versions")
            .with_no_client_auth()
            .with_single_cert(vec![cert.der().clone()], key)
            .expect("server TLS config");
        TestCa { ca_pem: ca.pem(), server: Arc::new(server), server_cert_pem, server_key_pem }
    }

    /// The CA certificate, PEM: the trust bundle for a client of the emulator.
    pub fn ca_pem(&self) -> &str {
        &self.ca_pem
    }

    /// Writes the CA certificate to `dir/ca.pem` and returns the path, for `tls.caFile`.
    pub fn write_ca_file(&self, dir: &Path) -> std::io::Result<PathBuf> {
        let path = dir.join("ca.pem");
        std::fs::write(&path, &self.ca_pem)?;
        Ok(path)
    }

    /// Writes the server certificate and key to `dir/server.pem` and `dir/server.key`, for a
    /// server that takes files (the distribution registry's `http.tls`).
    pub fn write_server_files(&self, dir: &Path) -> std::io::Result<(PathBuf, PathBuf)> {
        let (cert, key) = (dir.join("server.pem"), dir.join("server.key"));
        std::fs::write(&cert, &self.server_cert_pem)?;
        std::fs::write(&key, &self.server_key_pem)?;
        Ok((cert, key))
    }

    pub fn server_config(&self) -> Arc<rustls::ServerConfig> {
        self.server.clone()
    }
}

impl Default for TestCa {
    fn default() -> Self {
        TestCa::new()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_bundle_is_one_ca_certificate_and_no_key() {
        let ca = TestCa::new();
        assert!(ca.ca_pem().starts_with("-----BEGIN CERTIFICATE-----"), "{}", ca.ca_pem());
        assert_eq!(ca.ca_pem().matches("BEGIN CERTIFICATE").count(), 1);
        assert!(!ca.ca_pem().contains("PRIVATE KEY"));
        assert_ne!(TestCa::new().ca_pem(), ca.ca_pem(), "every CA is new");
    }
}
