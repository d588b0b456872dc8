//! An external signer: a program this tool runs for each operation, one
//! JSON request on its standard input, one JSON answer on its standard
//! output (docs/signing.md, "External signers"). A cloud KMS (AWS KMS,
//! Azure Key Vault, Google Cloud KMS, Vault's transit engine) is plugged
//! in by a few lines of script around its own command-line tool; this
//! project links no SDK.
//!
//! Requests (`protocol` is always `imager-signer-1`):
//!
//! ```json
//! {"protocol":"imager-signer-1","op":"public-key"}
//! {"protocol":"imager-signer-1","op":"sign","algorithm":"ed25519","message":"<base64>"}
//! ```
//!
//! Answers: `{"public_key":"<base64 DER SubjectPublicKeyInfo>"}`,
//! `{"signature":"<base64>"}` (ed25519: the 64 bytes; `rsa-pkcs1-sha256`:
//! the signature of the message's SHA-256, as long as the modulus), or
//! `{"error":"…"}` with a non-zero exit. The program is configured by its
//! own environment and arguments-free path (which key, which account);
//! it gets [`TIMEOUT`] per request, and its answer is at most
//! [`MAX_ANSWER`] bytes ([`contract::process`]). What it prints on its
//! standard error is shown escaped when it fails. Its answers are parsed
//! by [`parse_answer`] (fuzz target `signer`).

use super::backend::{Algorithm, KeyBackend};
use anyhow::{Result, anyhow, bail};
use base64::Engine as _;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

/// The protocol's name and version, in every request.
pub const PROTOCOL: &str = "imager-signer-1";
/// The longest answer read.
pub const MAX_ANSWER: u64 = 64 << 10;
/// How long a request may take (a KMS over the network, an HSM that asks
/// for a touch).
pub const TIMEOUT: Duration = Duration::from_secs(120);

/// A key an external program holds.
pub struct ExternalKey {
    program: PathBuf,
}

impl ExternalKey {
    /// The signer `program` (a path, or a name on `PATH`).
    pub fn new(program: &Path) -> Result<ExternalKey> {
        if program.as_os_str().is_empty() {
            bail!("exec: names no program: exec:/path/to/signer");
        }
        Ok(ExternalKey {
            program: program.to_path_buf(),
        })
    }

    fn request(&self, request: serde_json::Value, field: &str) -> Result<Vec<u8>> {
        let input = serde_json::to_vec(&request)?;
        let what = self.describe();
        let out = contract::process::run(
            &mut Command::new(&self.program),
            &input,
            MAX_ANSWER,
            TIMEOUT,
        )
        .map_err(|e| anyhow!("{what}: {e}"))?;
        if out.overflowed() {
            bail!("{what}: answered over {MAX_ANSWER} bytes");
        }
        let answer = parse_answer(&out.stdout, field);
        if !out.status.success() {
            let why = match answer {
                Err(Failure::Said(e)) => e,
                _ => contract::text::excerpt(&String::from_utf8_lossy(&out.stderr)),
            };
            bail!("{what} failed ({}): {why}", out.status);
        }
        answer.map_err(|e| anyhow!("{what}: {e}"))
    }
}

impl KeyBackend for ExternalKey {
    fn public_key_der(&self) -> Result<Vec<u8>> {
        self.request(
            serde_json::json!({"protocol": PROTOCOL, "op": "public-key"}),
            "public_key",
        )
    }

    fn sign(&self, algorithm: Algorithm, message: &[u8]) -> Result<Vec<u8>> {
        self.request(
            serde_json::json!({
                "protocol": PROTOCOL,
                "op": "sign",
                "algorithm": algorithm.name(),
                "message": base64::engine::general_purpose::STANDARD.encode(message),
            }),
            "signature",
        )
    }

    fn describe(&self) -> String {
        format!(
            "the external signer {}",
            contract::text::excerpt(&self.program.display().to_string())
        )
    }
}

/// Why an answer gave nothing.
#[derive(Debug, PartialEq, Eq)]
pub enum Failure {
    /// The program said why (its `error`, escaped).
    Said(String),
    /// The answer is not one of the protocol's.
    Malformed(String),
}

impl std::fmt::Display for Failure {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Failure::Said(e) => write!(f, "it said: {e}"),
            Failure::Malformed(e) => write!(f, "{e}"),
        }
    }
}

/// The bytes of `field` (base64) in an answer; its `error` if it has one.
pub fn parse_answer(answer: &[u8], field: &str) -> Result<Vec<u8>, Failure> {
    let v: serde_json::Map<String, serde_json::Value> =
        serde_json::from_slice(answer).map_err(|_| {
            Failure::Malformed(format!(
                "its answer is not a JSON object (the protocol is {PROTOCOL}, docs/signing.md)"
            ))
        })?;
    if let Some(e) = v.get("error") {
        let text = e.as_str().unwrap_or("(not a string)");
        return Err(Failure::Said(contract::text::excerpt(text)));
    }
    let value = v
        .get(field)
        .and_then(|f| f.as_str())
        .ok_or_else(|| Failure::Malformed(format!("its answer has no {field}")))?;
    base64::engine::general_purpose::STANDARD
        .decode(value.trim())
        .map_err(|_| Failure::Malformed(format!("its {field} is not base64")))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn answers_are_read_and_errors_said_escaped() {
        assert_eq!(
            parse_answer(br#"{"signature":"AAEC"}"#, "signature"),
            Ok(vec![0, 1, 2])
        );
        assert_eq!(
            parse_answer(br#"{"error":"denied \u001b[2J by policy"}"#, "signature"),
            Err(Failure::Said(contract::text::excerpt(
                "denied \u{1b}[2J by policy"
            )))
        );
        for bad in [
            &b"not json"[..],
            b"[]",
            br#"{"signature":1}"#,
            br#"{"signature":"!!"}"#,
            br#"{}"#,
        ] {
            assert!(
                matches!(parse_answer(bad, "signature"), Err(Failure::Malformed(_))),
                "{bad:?}"
            );
        }
    }

    /// A program that answers: what the protocol sends, what comes back,
    /// and what is refused (a failure with its reason, a hang, garbage).
    #[test]
    fn a_program_is_asked_and_its_failures_said() {
        let dir = tempfile::tempdir().unwrap();
        let script = |name: &str, body: &str| {
            let p = dir.path().join(name);
            std::fs::write(&p, format!("#!/bin/sh\n{body}\n")).unwrap();
            use std::os::unix::fs::PermissionsExt;
            std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o755)).unwrap();
            ExternalKey::new(&p).unwrap()
        };
        // It echoes the request back as the "public key".
        let echo = script(
            "echo",
            r#"req=$(cat); printf '{"public_key":"%s"}' "$(printf %s "$req" | base64 -w0)""#,
        );
        let got: serde_json::Value =
            serde_json::from_slice(&echo.public_key_der().unwrap()).unwrap();
        assert_eq!(
            got,
            serde_json::json!({"protocol": "imager-signer-1", "op": "public-key"})
        );
        let refuses = script(
            "refuses",
            r#"cat >/dev/null; echo '{"error":"no such key"}'; exit 3"#,
        );
        let e = format!("{:#}", refuses.sign(Algorithm::Ed25519, b"m").unwrap_err());
        assert!(
            e.contains("no such key") && e.contains("exit status: 3"),
            "{e}"
        );
        let moans = script("moans", "cat >/dev/null; echo 'token expired' >&2; exit 1");
        let e = format!("{:#}", moans.sign(Algorithm::Ed25519, b"m").unwrap_err());
        assert!(e.contains("token expired"), "{e}");
        let garbage = script("garbage", "cat >/dev/null; echo hello");
        let e = format!("{:#}", garbage.sign(Algorithm::Ed25519, b"m").unwrap_err());
        assert!(e.contains("not a JSON object"), "{e}");
        let e = format!(
            "{:#}",
            ExternalKey::new(Path::new("/nonexistent/signer"))
                .unwrap()
                .public_key_der()
                .unwrap_err()
        );
        assert!(e.contains("cannot run it"), "{e}");
    }
}
