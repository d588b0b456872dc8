//! Artifacts: what a build produces, as listed in the manifest and in
//! `imager build --json`. The types are the `payload` crate's (the signed
//! manifest lists them); re-exported here.

pub use payload::artifact::{Artifact, Kind};
