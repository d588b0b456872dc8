//! Both ends of the node API's TLS: version 1.3 only, rustls with the
//! `ring` provider, the cluster CA the one root on each side.
//!
//! - The server ([`server_config`]) requires a client certificate that
//!   chains to the CA; a connection without one, or with one from another
//!   CA, fails in the handshake. After it, [`peer_role`] reads the role
//!   from the client's certificate.
//! - The client ([`client_config`]) trusts only the CA for the server's
//!   certificate, and presents its own.

use crate::Role;
use anyhow::{Context, Result, bail};
use rustls::client::danger::ServerCertVerifier;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use std::sync::Arc;

/// Bound on a PEM credential file's size.
pub const MAX_PEM: usize = 64 * 1024;

fn provider() -> Arc<rustls::crypto::CryptoProvider> {
    Arc::new(rustls::crypto::ring::default_provider())
}

/// The certificates of a PEM text (at least one).
pub fn certs(pem: &[u8], what: &str) -> Result<Vec<CertificateDer<'static>>> {
    if pem.len() > MAX_PEM {
        bail!("the {what} is over {MAX_PEM} bytes: not a certificate file");
    }
    let certs = CertificateDer::pem_slice_iter(pem)
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| anyhow::anyhow!("the {what} is not PEM certificates: {e:?}"))?;
    if certs.is_empty() {
        bail!("the {what} holds no certificate (PEM `CERTIFICATE` blocks)");
    }
    Ok(certs)
}

/// The private key of a PEM text.
pub fn private_key(pem: &[u8], what: &str) -> Result<PrivateKeyDer<'static>> {
    if pem.len() > MAX_PEM {
        bail!("the {what} is over {MAX_PEM} bytes: not a key file");
    }
    // (The error never quotes the key.)
    PrivateKeyDer::from_pem_slice(pem)
        .map_err(|_| anyhow::anyhow!("the {what} is not a PEM private key"))
}

fn roots(ca_pem: &[u8]) -> Result<Arc<rustls::RootCertStore>> {
    let mut roots = rustls::RootCertStore::empty();
    for c in certs(ca_pem, "cluster CA certificate")? {
        roots
            .add(c)
            .context("the cluster CA certificate is not one rustls can trust")?;
    }
    Ok(Arc::new(roots))
}

/// The server's configuration: its certificate chain and key (issued by
/// the CA for the node), clients authenticated by `ca_pem`.
pub fn server_config(
    ca_pem: &[u8],
    cert_pem: &[u8],
    key_pem: &[u8],
) -> Result<Arc<rustls::ServerConfig>> {
    let verifier =
        rustls::server::WebPkiClientVerifier::builder_with_provider(roots(ca_pem)?, provider())
            .build()
            .context("building the client certificate verifier")?;
    let config = rustls::ServerConfig::builder_with_provider(provider())
        .with_protocol_versions(&[&rustls::version::TLS13])
        .context("TLS 1.3")?
        .with_client_cert_verifier(verifier)
        .with_single_cert(
            certs(cert_pem, "node certificate")?,
            private_key(key_pem, "node key")?,
        )
        .context("the node certificate and key do not go together")?;
    Ok(Arc::new(config))
}

/// The client's configuration: the server authenticated by `ca_pem`, the
/// client by its certificate and key (issued by the same CA).
pub fn client_config(
    ca_pem: &[u8],
    cert_pem: &[u8],
    key_pem: &[u8],
) -> Result<Arc<rustls::ClientConfig>> {
    let config = rustls::ClientConfig::builder_with_provider(provider())
        .with_protocol_versions(&[&rustls::version::TLS13])
        .context("TLS 1.3")?
        .with_root_certificates(roots(ca_pem)?)
        .with_client_auth_cert(
            certs(cert_pem, "client certificate")?,
            private_key(key_pem, "client key")?,
        )
        .context("the client certificate and key do not go together")?;
    Ok(Arc::new(config))
}

/// The role of the client of an established connection (its certificate
/// was verified in the handshake).
pub fn peer_role(conn: &rustls::ServerConnection) -> Result<Role> {
    let cert = conn
        .peer_certificates()
        .and_then(|c| c.first())
        .context("the client presented no certificate")?;
    role_of(cert)
}

/// The role a certificate (DER) names in its subject's organization.
pub fn role_of(cert: &[u8]) -> Result<Role> {
    use der::Decode;
    let cert = x509_cert::Certificate::from_der(cert)
        .map_err(|e| anyhow::anyhow!("the client certificate does not decode: {e}"))?;
    let mut orgs = Vec::new();
    for rdn in cert.tbs_certificate.subject.0.iter() {
        for atv in rdn.0.iter() {
            if atv.oid != const_oid::db::rfc4519::ORGANIZATION_NAME {
                continue;
            }
            let text = der::asn1::Utf8StringRef::try_from(&atv.value)
                .map(|s| s.as_str().to_string())
                .or_else(|_| {
                    der::asn1::PrintableStringRef::try_from(&atv.value)
                        .map(|s| s.as_str().to_string())
                })
                .map_err(|_| {
                    anyhow::anyhow!("the client certificate's organization is not text")
                })?;
            orgs.push(text);
        }
    }
    Role::from_organizations(orgs.iter().map(String::as_str))
}

/// Checks a node's credentials before they are provisioned: the
/// certificate chains to the CA for serving as `name` (a DNS name or an IP
/// address in its subject alternative names), and the key is its key.
pub fn check_node(ca_pem: &[u8], cert_pem: &[u8], key_pem: &[u8], name: &str) -> Result<()> {
    let chain = certs(cert_pem, "node certificate")?;
    let server_name = rustls::pki_types::ServerName::try_from(name.to_string())
        .map_err(|_| anyhow::anyhow!("{name:?} is not a DNS name or an IP address"))?;
    let verifier =
        rustls::client::WebPkiServerVerifier::builder_with_provider(roots(ca_pem)?, provider())
            .build()
            .context("building the server certificate verifier")?;
    verifier
        .verify_server_cert(
            &chain[0],
            &chain[1..],
            &server_name,
            &[],
            rustls::pki_types::UnixTime::now(),
        )
        .map_err(|e| {
            anyhow::anyhow!(
                "the node certificate is not valid for {name} under this CA ({e}): make it \
                 with `imager node credentials DIR --node {name}` in the same directory"
            )
        })?;
    server_config(ca_pem, cert_pem, key_pem)?;
    Ok(())
}
