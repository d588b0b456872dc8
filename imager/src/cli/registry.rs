//! `imager push`, and the flags every command that talks to a registry
//! takes ([`RegistryArgs`], turned into [`imager::remote::Access`]).

use anyhow::{Context, Result, anyhow};
use std::path::PathBuf;
use std::process::ExitCode;

/// Registry credentials: given (the password on stdin), or looked up where
/// podman, skopeo and docker keep them.
#[derive(Debug, Clone, Default, clap::Args)]
pub struct CredentialArgs {
    /// The registry user name to authenticate with; the password (or
    /// token) is read from stdin's first line, never from the command line.
    #[arg(long, value_name = "USER", requires = "password_stdin")]
    pub username: Option<String>,
    /// Read the registry password or token from stdin (with --username).
    #[arg(long, requires = "username")]
    pub password_stdin: bool,
    /// The auth file to read registry credentials from, instead of
    /// $REGISTRY_AUTH_FILE, containers' auth.json and Docker's config.json
    /// (with their credential helpers).
    #[arg(long, value_name = "FILE")]
    pub authfile: Option<PathBuf>,
}

impl CredentialArgs {
    /// The credentials given on the command line, if any (the password
    /// read from stdin).
    pub fn explicit(&self) -> Result<Option<registry::Credentials>> {
        match &self.username {
            None => Ok(None),
            Some(user) => {
                let password = imager::remote::read_password(std::io::stdin().lock())?;
                Ok(Some(
                    registry::Credentials::basic(user, &password).map_err(|e| anyhow!("{e}"))?,
                ))
            }
        }
    }

    /// The credentials for `reference`: given, else found on this host;
    /// and where they came from.
    pub fn lookup(
        &self,
        reference: &registry::Reference,
    ) -> Result<(registry::Credentials, Option<String>)> {
        imager::remote::credentials(
            reference,
            self.explicit()?.as_ref(),
            self.authfile.as_deref(),
        )
    }
}

/// How to reach the registry: credentials, plain HTTP, a private CA.
#[derive(Debug, Clone, Default, clap::Args)]
pub struct RegistryArgs {
    #[command(flatten)]
    pub credentials: CredentialArgs,
    /// Speak plain HTTP to the registry (a local docker-registry): never
    /// tried otherwise.
    #[arg(long)]
    pub plain_http: bool,
    /// PEM CA certificates to trust for the registry instead of the
    /// Mozilla roots (a private registry's CA).
    #[arg(long, value_name = "FILE")]
    pub ca: Option<PathBuf>,
}

impl RegistryArgs {
    pub fn access(&self) -> Result<imager::remote::Access> {
        Ok(imager::remote::Access {
            credentials: self.credentials.explicit()?,
            authfile: self.credentials.authfile.clone(),
            plain_http: self.plain_http,
            ca: self.ca.clone(),
        })
    }
}

#[derive(Debug, Clone, clap::Args)]
pub struct PushArgs {
    /// The OCI archive to push (an installer image: out/PROFILE/installer.tar,
    /// or `imager index`'s of several architectures, pushed whole), or an
    /// OCI image layout directory.
    pub archive: PathBuf,
    /// Where: REGISTRY/NAME:TAG (or REGISTRY/NAME@DIGEST, the image's own).
    pub reference: String,
    #[command(flatten)]
    pub registry: RegistryArgs,
    /// Write the pushed manifest's digest (sha256:…) and a newline to FILE
    /// once the push is complete.
    #[arg(long, value_name = "FILE")]
    pub digest_file: Option<PathBuf>,
    /// Print one JSON object on stdout: the reference, digest and blobs.
    #[arg(long)]
    pub json: bool,
}

pub fn push(a: &PushArgs) -> Result<ExitCode> {
    let reference = registry::Reference::parse(&a.reference)
        .map_err(|e| anyhow!("{e}"))
        .context("the reference to push to")?;
    let access = a.registry.access()?;
    let (client, source) = imager::remote::client(&reference, &access)?;
    if !a.json {
        match &source {
            Some(s) => eprintln!("push: credentials for {} from {s}", reference.registry()),
            None => eprintln!(
                "push: no credentials for {}: anonymous",
                reference.registry()
            ),
        }
    }
    let json = a.json;
    let mut say = |line: String| {
        if !json {
            eprintln!("push: {line}");
        }
    };
    let report = imager::oci::push(&a.archive, &reference, &client, &mut say)?;
    if let Some(f) = &a.digest_file {
        imager::io::write_atomic(f, format!("{}\n", report.digest).as_bytes(), 0o644)
            .with_context(|| format!("writing the digest to {}", f.display()))?;
    }
    if a.json {
        println!("{}", serde_json::to_string_pretty(&report)?);
    } else {
        println!("pushed {} as {}", reference, report.pinned);
    }
    Ok(ExitCode::SUCCESS)
}

#[derive(clap::Args)]
pub struct IndexArgs {
    /// The installer archives (installer.tar of `imager build`), one per
    /// architecture, of the same system and version.
    #[arg(required = true, num_args = 2..)]
    pub archives: Vec<PathBuf>,
    /// The archive to write (replaced atomically).
    #[arg(long)]
    pub out: PathBuf,
    /// Print the result as JSON on stdout.
    #[arg(long)]
    pub json: bool,
}

pub fn index(a: &IndexArgs) -> Result<ExitCode> {
    let r = imager::oci::combine(&a.out, &a.archives)?;
    if a.json {
        println!("{}", serde_json::to_string_pretty(&r)?);
    } else {
        let images: Vec<String> = r
            .images
            .iter()
            .map(|(arch, d)| format!("{arch} {d}"))
            .collect();
        println!(
            "index: {} ({}) holds {}: {}",
            r.path.display(),
            r.ref_name,
            images.join(", "),
            r.digest
        );
    }
    Ok(ExitCode::SUCCESS)
}
