//! Pulls an image with the registry client and checks every blob, writing
//! nothing: `cargo run -p registry --example pull -- [--plain-http HOST:PORT]
//! REGISTRY/NAME:TAG`. Prints the manifest's digest, then each blob's
//! digest and size once it has been read and verified. (Also what
//! docs/registry.md measures the client's size with.)

use std::process::ExitCode;

fn main() -> ExitCode {
    let mut options = registry::Options::default();
    let mut reference = None;
    let mut args = std::env::args().skip(1);
    while let Some(a) = args.next() {
        match a.as_str() {
            "--plain-http" => options.plain_http.extend(args.next()),
            _ => reference = Some(a),
        }
    }
    let Some(reference) = reference else {
        eprintln!("usage: pull [--plain-http HOST:PORT] REGISTRY/NAME:TAG");
        return ExitCode::from(2);
    };
    match pull(options, &reference) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("pull: {e}");
            ExitCode::FAILURE
        }
    }
}

fn pull(options: registry::Options, reference: &str) -> Result<(), Box<dyn std::error::Error>> {
    let reference = registry::Reference::parse(reference)?;
    let client = registry::Client::new(options)?;
    let manifest = client.manifest(&reference)?;
    println!("manifest {} {}", manifest.digest, manifest.media_type);
    for d in std::iter::once(&manifest.config).chain(&manifest.layers) {
        let mut blob = client.blob(&reference, d)?;
        let n = std::io::copy(&mut blob, &mut std::io::sink())?;
        println!("{} {n} {}", d.digest, d.media_type);
    }
    Ok(())
}
