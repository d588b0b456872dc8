//! `imager keygen` and `imager verify`: the arguments.

use imager::sign::{KeygenOptions, VerifyOptions};
use std::path::PathBuf;

/// `imager keygen`: create a signing key pair.
#[derive(Debug, Clone, clap::Args)]
pub struct KeygenArgs {
    /// Where to write the private key (PKCS#8 PEM, mode 0600).
    #[arg(
        long = "private",
        alias = "out-private",
        value_name = "PATH",
        default_value = "out/keys/signing.key"
    )]
    pub out_private: PathBuf,
    /// Where to write the public key (SPKI PEM) [default: the private key's
    /// path with the extension .pub].
    #[arg(long = "public", alias = "out-public", value_name = "PATH")]
    pub out_public: Option<PathBuf>,
    /// Make Secure Boot keys instead, in DIR: PK, KEK and db (RSA-2048 keys,
    /// mode 0600, with self-signed X.509 certificates) and an owner GUID.
    #[arg(
        long = "secure-boot",
        value_name = "DIR",
        conflicts_with_all = ["out_private", "out_public"]
    )]
    pub secure_boot: Option<PathBuf>,
    /// Replace existing key files.
    #[arg(long)]
    pub force: bool,
}

impl KeygenArgs {
    pub fn options(&self) -> KeygenOptions {
        KeygenOptions {
            out_private: self.out_private.clone(),
            out_public: self.out_public.clone(),
            force: self.force,
        }
    }
}

/// `imager verify`: check a signed manifest and its artifacts.
#[derive(Debug, Clone, clap::Args)]
pub struct VerifyArgs {
    /// The manifest.json, or the directory containing it.
    #[arg(value_name = "MANIFEST")]
    pub manifest: PathBuf,
    /// The trusted public key (SPKI PEM, or 64 hex digits) [default:
    /// out/keys/dev.pub, the development key, if it exists].
    #[arg(long, value_name = "PUB")]
    pub key: Option<PathBuf>,
    /// Print the report as JSON on stdout.
    #[arg(long)]
    pub json: bool,
}

impl VerifyArgs {
    pub fn options(&self) -> VerifyOptions {
        VerifyOptions {
            manifest: self.manifest.clone(),
            key: self.key.clone(),
            json: self.json,
        }
    }
}

#[cfg(test)]
mod tests {
    use crate::{Cli, Command};
    use clap::Parser;
    use std::path::Path;

    #[test]
    fn keygen_and_verify_arguments() {
        let Command::Keygen(k) = Cli::try_parse_from(["imager", "keygen"]).unwrap().command else {
            panic!()
        };
        assert_eq!(k.out_private, Path::new("out/keys/signing.key"));
        assert_eq!(k.options().public_path(), Path::new("out/keys/signing.pub"));
        assert!(!k.force);
        assert_eq!(k.secure_boot, None);
        let Command::Keygen(k) = Cli::try_parse_from(["imager", "keygen", "--secure-boot", "sb"])
            .unwrap()
            .command
        else {
            panic!()
        };
        assert_eq!(k.secure_boot.as_deref(), Some(Path::new("sb")));
        assert!(
            Cli::try_parse_from(["imager", "keygen", "--secure-boot", "sb", "--private", "k"])
                .is_err()
        );
        let Command::Verify(v) =
            Cli::try_parse_from(["imager", "verify", "out", "--key", "k.pub", "--json"])
                .unwrap()
                .command
        else {
            panic!()
        };
        let v = v.options();
        assert_eq!(
            (v.manifest.as_path(), v.key.as_deref(), v.json),
            (Path::new("out"), Some(Path::new("k.pub")), true)
        );
    }
}
