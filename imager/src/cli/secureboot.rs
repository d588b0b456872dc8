//! `imager secureboot sign|verify|enrol-files`: the arguments, turned into
//! calls of `imager::secureboot` (keys come from `imager keygen
//! --secure-boot DIR`).

use imager::secureboot::{SecureBootKeys, auth, authenticode, keys, write_enrolment};
use std::path::PathBuf;
use std::process::ExitCode;

#[derive(Debug, Clone, clap::Subcommand)]
pub enum SecurebootCommand {
    /// Sign a PE (systemd-boot, a UKI) with the db key (Authenticode).
    Sign(SignArgs),
    /// Check a signed PE against a certificate (exit 1 if it does not verify).
    Verify(VerifyArgs),
    /// Write PK.auth, KEK.auth and db.auth (signed variable updates,
    /// time-stamped with SOURCE_DATE_EPOCH) for enrolling the keys; with
    /// --add-db, --revoke or --revoke-cert, the KEK-signed appends db.append.auth and
    /// dbx.append.auth instead (a profile's secure_boot.updates).
    EnrolFiles(EnrolArgs),
}

#[derive(Debug, Clone, clap::Args)]
pub struct SignArgs {
    /// The key directory (from `imager keygen --secure-boot DIR`).
    #[arg(long, value_name = "DIR")]
    pub keys: PathBuf,
    /// The unsigned PE image.
    pub input: PathBuf,
    /// Where to write the signed image [default: replace INPUT].
    #[arg(long, short, value_name = "PATH")]
    pub output: Option<PathBuf>,
}

#[derive(Debug, Clone, clap::Args)]
pub struct VerifyArgs {
    /// The certificate to check against (PEM or DER), e.g. DIR/db.crt.
    #[arg(long, value_name = "CRT")]
    pub cert: PathBuf,
    /// The signed PE images.
    #[arg(required = true)]
    pub files: Vec<PathBuf>,
}

#[derive(Debug, Clone, clap::Args)]
pub struct EnrolArgs {
    /// The key directory (from `imager keygen --secure-boot DIR`).
    #[arg(long, value_name = "DIR")]
    pub keys: PathBuf,
    /// Where to write the three files (for systemd-boot:
    /// ESP/loader/keys/auto).
    #[arg(long, value_name = "DIR")]
    pub out: PathBuf,
    /// A db certificate (PEM or DER) to add to firmware's db: written to
    /// db.append.auth, signed by the KEK (a db key's rotation; repeatable).
    #[arg(long, value_name = "CRT")]
    pub add_db: Vec<PathBuf>,
    /// A signed PE (a UKI, systemd-boot) whose Authenticode digest firmware
    /// must refuse: written to dbx.append.auth, signed by the KEK
    /// (repeatable).
    #[arg(long, value_name = "PE")]
    pub revoke: Vec<PathBuf>,
    /// A db certificate (PEM or DER) firmware must stop trusting: every
    /// image its key signed is refused (a leaked db key's retirement).
    /// Written to dbx.append.auth, signed by the KEK (repeatable).
    #[arg(long, value_name = "CRT")]
    pub revoke_cert: Vec<PathBuf>,
}

pub fn run(cmd: &SecurebootCommand) -> anyhow::Result<ExitCode> {
    match cmd {
        SecurebootCommand::Sign(a) => {
            let keys = SecureBootKeys::load(&a.keys)?;
            let dest = a.output.as_ref().unwrap_or(&a.input);
            let r = imager::secureboot::sign(&a.input, &keys.db, dest)?;
            println!(
                "signed {} with {}: Authenticode sha256 {}",
                r.path.display(),
                r.signer,
                r.digest
            );
            Ok(ExitCode::SUCCESS)
        }
        SecurebootCommand::Verify(a) => {
            let cert = keys::load_cert(&a.cert)?;
            let mut failed = false;
            for f in &a.files {
                match authenticode::verify_file(f, &cert) {
                    Ok(v) => println!(
                        "{}: OK, signed by {} (sha256 {})",
                        f.display(),
                        v.signer,
                        v.digest
                    ),
                    Err(e) => {
                        failed = true;
                        println!("{}: FAILED: {e:#}", f.display());
                    }
                }
            }
            Ok(if failed {
                ExitCode::from(1)
            } else {
                ExitCode::SUCCESS
            })
        }
        SecurebootCommand::EnrolFiles(a) => {
            let keys = SecureBootKeys::load(&a.keys)?;
            let epoch = imager::build::source_date_epoch(&a.keys)?;
            let written = if a.add_db.is_empty() && a.revoke.is_empty() && a.revoke_cert.is_empty()
            {
                write_enrolment(&keys, epoch, &a.out)?
            } else {
                let mut changes = auth::Changes::default();
                for c in &a.add_db {
                    changes
                        .add_db
                        .push(der::Encode::to_der(&keys::load_cert(c)?)?);
                }
                for pe in &a.revoke {
                    changes.revoke.push(authenticode::file_digest(pe)?);
                }
                for c in &a.revoke_cert {
                    changes
                        .revoke_certs
                        .push(der::Encode::to_der(&keys::load_cert(c)?)?);
                }
                auth::write_files(&auth::update_files(&keys, epoch, &changes)?, &a.out)?
            };
            for p in written {
                println!("wrote {}", p.display());
            }
            Ok(ExitCode::SUCCESS)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::SecurebootCommand;
    use crate::{Cli, Command};
    use clap::Parser;
    use std::path::Path;

    #[test]
    fn secureboot_arguments() {
        let parse = |args: &[&str]| match Cli::try_parse_from(args).map(|c| c.command) {
            Ok(Command::Secureboot { command }) => Some(command),
            _ => None,
        };
        let Some(SecurebootCommand::Sign(s)) = parse(&[
            "imager",
            "secureboot",
            "sign",
            "--keys",
            "k",
            "a.efi",
            "-o",
            "b.efi",
        ]) else {
            panic!()
        };
        assert_eq!(
            (s.keys.as_path(), s.input.as_path()),
            (Path::new("k"), Path::new("a.efi"))
        );
        assert_eq!(s.output.as_deref(), Some(Path::new("b.efi")));
        assert!(parse(&["imager", "secureboot", "verify", "--cert", "db.crt"]).is_none());
        let Some(SecurebootCommand::EnrolFiles(e)) = parse(&[
            "imager",
            "secureboot",
            "enrol-files",
            "--keys",
            "k",
            "--out",
            "o",
        ]) else {
            panic!()
        };
        assert_eq!(e.out, Path::new("o"));
    }
}
