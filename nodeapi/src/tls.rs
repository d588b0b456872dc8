//! Both ends of the node API's TLS: version 1.3 only, rustls with the
//! `ring` provider, the cluster CA the one root on each side.
//!
//! - The server ([`server_config`]) requires a client certificate that
//!   chains to the CA; a connection without one, or with one from another
//!   CA, fails in the handshake. After it, [`peer_role`] reads the role
//!   from the client's certificate.
//! - The client ([`client_config`]) trusts only the CA for the server's
//!   certificate, and presents its own.
//!
//! The CA text may hold several certificates (a CA rollover: the old and
//! the new CA trusted together, docs/node-api.md). The server's
//! [`Policy`] adds what the CA alone cannot say: certificates revoked by
//! their SHA-256 fingerprint (refused in the handshake with the
//! `certificate_revoked` alert), and a floor under the clock (a node
//! without a battery-backed clock boots in 1970, when every certificate
//! is "not yet valid": its time is taken as at least its build's
//! SOURCE_DATE_EPOCH).

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

/// What the server checks beside the CA.
#[derive(Debug, Clone, Default)]
pub struct Policy {
    /// The earliest time the clock may say (seconds since 1970): a clock
    /// behind it is taken as it.
    pub clock_floor: u64,
    /// SHA-256 of the DER of client certificates refused whatever their
    /// chain.
    pub revoked: Vec<[u8; 32]>,
}

/// The SHA-256 fingerprint of a certificate (DER), as `revoked` lists it
/// and `openssl x509 -fingerprint -sha256` prints it.
pub fn fingerprint(der: &[u8]) -> [u8; 32] {
    use sha2::Digest;
    sha2::Sha256::digest(der).into()
}

/// The clock, but never before `floor`.
#[derive(Debug)]
struct FlooredClock(u64);

impl rustls::time_provider::TimeProvider for FlooredClock {
    fn current_time(&self) -> Option<rustls::pki_types::UnixTime> {
        Some(rustls::pki_types::UnixTime::since_unix_epoch(
            std::time::Duration::from_secs(now().max(self.0)),
        ))
    }
}

/// Seconds since 1970 by this machine's clock (0 before it).
pub fn now() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}

/// The CA's verifier, refusing revoked certificates first.
#[derive(Debug)]
struct Revoking {
    inner: Arc<dyn rustls::server::danger::ClientCertVerifier>,
    revoked: Vec<[u8; 32]>,
}

impl rustls::server::danger::ClientCertVerifier for Revoking {
    fn root_hint_subjects(&self) -> &[rustls::DistinguishedName] {
        self.inner.root_hint_subjects()
    }

    fn verify_client_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        intermediates: &[CertificateDer<'_>],
        now: rustls::pki_types::UnixTime,
    ) -> Result<rustls::server::danger::ClientCertVerified, rustls::Error> {
        if self.revoked.contains(&fingerprint(end_entity)) {
            return Err(rustls::Error::InvalidCertificate(
                rustls::CertificateError::Revoked,
            ));
        }
        self.inner
            .verify_client_cert(end_entity, intermediates, now)
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &rustls::DigitallySignedStruct,
    ) -> Result<rustls::client::danger::HandshakeSignatureValid, rustls::Error> {
        self.inner.verify_tls12_signature(message, cert, dss)
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &rustls::DigitallySignedStruct,
    ) -> Result<rustls::client::danger::HandshakeSignatureValid, rustls::Error> {
        self.inner.verify_tls13_signature(message, cert, dss)
    }

    fn supported_verify_schemes(&self) -> Vec<rustls::SignatureScheme> {
        self.inner.supported_verify_schemes()
    }
}

/// The server's configuration: its certificate chain and key (issued by
/// the CA for the node), clients authenticated by `ca_pem` under `policy`.
pub fn server_config(
    ca_pem: &[u8],
    cert_pem: &[u8],
    key_pem: &[u8],
    policy: &Policy,
) -> Result<Arc<rustls::ServerConfig>> {
    let verifier =
        rustls::server::WebPkiClientVerifier::builder_with_provider(roots(ca_pem)?, provider())
            .build()
            .context("building the client certificate verifier")?;
    let verifier = Arc::new(Revoking {
        inner: verifier,
        revoked: policy.revoked.clone(),
    });
    let config = rustls::ServerConfig::builder_with_details(
        provider(),
        Arc::new(FlooredClock(policy.clock_floor)),
    )
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
    // The chain and the names are checked, not the clock of the machine
    // checking (a node's may be behind, or floored at its build's time):
    // at the certificate's own start, which its clients judge by theirs.
    let at = not_before(&chain[0]).map_or_else(rustls::pki_types::UnixTime::now, |t| {
        rustls::pki_types::UnixTime::since_unix_epoch(std::time::Duration::from_secs(t))
    });
    verifier
        .verify_server_cert(&chain[0], &chain[1..], &server_name, &[], at)
        .map_err(|e| {
            anyhow::anyhow!(
                "the node certificate is not valid for {name} under this CA ({e}): make it \
                 with `imager node credentials DIR --node {name}` in the same directory"
            )
        })?;
    server_config(ca_pem, cert_pem, key_pem, &Policy::default())?;
    Ok(())
}

/// The names and addresses a node's certificate (the first of `cert_pem`)
/// is for: its subject alternative names, DNS names and IP addresses, as
/// text. What replaces it must be valid for each ([`check_node`]).
pub fn server_names(cert_pem: &[u8]) -> Result<Vec<String>> {
    use der::Decode;
    use x509_cert::ext::pkix::SubjectAltName;
    use x509_cert::ext::pkix::name::GeneralName;
    let chain = certs(cert_pem, "node certificate")?;
    let cert = x509_cert::Certificate::from_der(&chain[0])
        .map_err(|_| anyhow::anyhow!("the node certificate does not decode"))?;
    let san = cert
        .tbs_certificate
        .get::<SubjectAltName>()
        .map_err(|_| anyhow::anyhow!("the node certificate's names do not decode"))?;
    let mut names = Vec::new();
    for n in san.map(|(_, s)| s.0).unwrap_or_default() {
        match n {
            GeneralName::DnsName(d) => names.push(d.to_string()),
            GeneralName::IpAddress(ip) => match ip.as_bytes().len() {
                4 => {
                    let b: [u8; 4] = ip.as_bytes().try_into().unwrap_or_default();
                    names.push(std::net::Ipv4Addr::from(b).to_string());
                }
                16 => {
                    let b: [u8; 16] = ip.as_bytes().try_into().unwrap_or_default();
                    names.push(std::net::Ipv6Addr::from(b).to_string());
                }
                _ => {}
            },
            _ => {}
        }
    }
    Ok(names)
}

/// Whether a client presenting `chain` (its certificate first) would be
/// trusted by a server whose CA text is `ca_pem`: what a node checks of
/// the client that replaces its CA, which must not lock itself out.
pub fn check_client(ca_pem: &[u8], chain: &[CertificateDer<'_>]) -> Result<()> {
    let Some((leaf, rest)) = chain.split_first() else {
        bail!("the client presented no certificate");
    };
    let verifier =
        rustls::server::WebPkiClientVerifier::builder_with_provider(roots(ca_pem)?, provider())
            .build()
            .context("building the client certificate verifier")?;
    verifier
        .verify_client_cert(leaf, rest, rustls::pki_types::UnixTime::now())
        .map_err(|e| {
            anyhow::anyhow!(
                "the certificate of the client asking would not be trusted under the new CA \
                 certificates ({e}): keep the CA that issued it among them until every client \
                 is renewed (a CA rollover, docs/node-api.md)"
            )
        })?;
    Ok(())
}

/// When a certificate (DER) starts being valid: its notBefore, seconds
/// since 1970 (`None`: it does not decode).
pub fn not_before(der: &[u8]) -> Option<u64> {
    use der::Decode;
    let cert = x509_cert::Certificate::from_der(der).ok()?;
    Some(
        cert.tbs_certificate
            .validity
            .not_before
            .to_unix_duration()
            .as_secs(),
    )
}

/// The DER of a certificate's subject public key info (`None`: it does
/// not decode): what its key's `public_key_der` must be.
pub fn public_key_der(der: &[u8]) -> Option<Vec<u8>> {
    use der::{Decode, Encode};
    let cert = x509_cert::Certificate::from_der(der).ok()?;
    cert.tbs_certificate.subject_public_key_info.to_der().ok()
}

/// When a certificate (DER) stops being valid: its notAfter, seconds since
/// 1970 (`None`: it does not decode).
pub fn not_after(der: &[u8]) -> Option<u64> {
    use der::Decode;
    let cert = x509_cert::Certificate::from_der(der).ok()?;
    Some(
        cert.tbs_certificate
            .validity
            .not_after
            .to_unix_duration()
            .as_secs(),
    )
}

/// How long before its end a certificate is said to be close to it.
pub const RENEW_WITHIN: u64 = 30 * 24 * 3600;
