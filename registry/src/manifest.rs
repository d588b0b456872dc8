//! The documents a registry answers a manifest request with, parsed from
//! untrusted bytes: an OCI image index or a Docker manifest list (several
//! images, one per platform), an OCI image manifest or a Docker v2 schema 2
//! manifest (one image: a config and layers). Only what a pull needs is
//! read; every digest is checked to be `sha256:<hex>` before it is used or
//! shown.

use crate::error::{Error, ErrorKind};
use crate::reference::{Digest, excerpt};
use serde::Deserialize;

pub const OCI_INDEX: &str = "application/vnd.oci.image.index.v1+json";
pub const OCI_MANIFEST: &str = "application/vnd.oci.image.manifest.v1+json";
pub const DOCKER_LIST: &str = "application/vnd.docker.distribution.manifest.list.v2+json";
pub const DOCKER_MANIFEST: &str = "application/vnd.docker.distribution.manifest.v2+json";
/// The manifest media types this client asks for, in the `Accept` header.
pub const ACCEPTED: [&str; 4] = [OCI_MANIFEST, DOCKER_MANIFEST, OCI_INDEX, DOCKER_LIST];

/// The most descriptors a document may list (layers, or an index's images).
pub const MAX_DESCRIPTORS: usize = 1024;
/// The longest media type accepted (RFC 6838 allows 127 + '/' + 127).
const MAX_MEDIA_TYPE: usize = 255;

/// A content descriptor: what a blob or manifest is, by digest and size.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Descriptor {
    pub media_type: String,
    pub digest: Digest,
    pub size: u64,
}

/// A platform of an index entry.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Platform {
    pub os: String,
    pub architecture: String,
    pub variant: Option<String>,
}

/// One image of an index.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct IndexEntry {
    pub descriptor: Descriptor,
    pub platform: Option<Platform>,
}

/// An image manifest: its config and its layers, bottom first.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ImageManifest {
    /// The manifest's media type (OCI or Docker).
    pub media_type: String,
    /// The digest of the manifest's bytes, as fetched.
    pub digest: Digest,
    pub config: Descriptor,
    pub layers: Vec<Descriptor>,
}

/// A parsed manifest document.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Document {
    Index(Vec<IndexEntry>),
    Image(ImageManifest),
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct RawDocument {
    schema_version: Option<i64>,
    media_type: Option<String>,
    config: Option<RawDescriptor>,
    layers: Option<Vec<RawDescriptor>>,
    manifests: Option<Vec<RawDescriptor>>,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct RawDescriptor {
    media_type: String,
    digest: String,
    size: i64,
    platform: Option<RawPlatform>,
}

#[derive(Deserialize)]
struct RawPlatform {
    os: String,
    architecture: String,
    variant: Option<String>,
}

fn invalid(msg: String) -> Error {
    Error::new(ErrorKind::Invalid, msg)
}

/// Parses a manifest document. `content_type` is the HTTP `Content-Type`
/// the registry sent (parameters allowed), used when the document does not
/// name its own media type; when both are given they must agree, so that
/// no document is read as one kind by this client and another by the
/// registry. `what` names the document in messages.
pub fn parse(bytes: &[u8], content_type: Option<&str>, what: &str) -> Result<Document, Error> {
    let raw: RawDocument = serde_json::from_slice(bytes)
        .map_err(|e| invalid(format!("{what} is not a JSON manifest: {}", json_error(&e))))?;
    if raw.schema_version != Some(2) {
        return Err(invalid(format!(
            "{what} has schemaVersion {}: only 2 is supported (OCI image manifests and \
             indexes, Docker v2 schema 2 manifests and manifest lists)",
            raw.schema_version
                .map_or_else(|| "(none)".to_string(), |v| v.to_string())
        )));
    }
    let header = content_type
        .map(|c| c.split(';').next().unwrap_or_default().trim())
        .filter(|c| !c.is_empty());
    let media_type = match (raw.media_type.as_deref(), header) {
        (Some(m), Some(h)) if m != h && ACCEPTED.contains(&h) => {
            return Err(invalid(format!(
                "{what} says it is {} but the registry sent it as {}: refusing an ambiguous \
                 manifest",
                excerpt(m),
                excerpt(h)
            )));
        }
        (Some(m), _) => m,
        (None, Some(h)) => h,
        (None, None) if raw.manifests.is_some() && raw.layers.is_none() => OCI_INDEX,
        (None, None) if raw.layers.is_some() && raw.manifests.is_none() => OCI_MANIFEST,
        (None, None) => {
            return Err(invalid(format!(
                "{what} names no media type and is neither an index nor an image manifest"
            )));
        }
    };
    match media_type {
        OCI_INDEX | DOCKER_LIST => {
            if raw.layers.is_some() || raw.config.is_some() {
                return Err(invalid(format!(
                    "{what} is an index but has layers or a config: refusing an ambiguous manifest"
                )));
            }
            let Some(list) = raw.manifests else {
                return Err(invalid(format!("{what} is an index without `manifests`")));
            };
            bounded(list.len(), what)?;
            let entries = list
                .into_iter()
                .enumerate()
                .map(|(i, d)| {
                    let platform = d.platform.as_ref().map(|p| Platform {
                        os: p.os.clone(),
                        architecture: p.architecture.clone(),
                        variant: p.variant.clone(),
                    });
                    Ok(IndexEntry {
                        descriptor: descriptor(d, &format!("image {i} of {what}"))?,
                        platform,
                    })
                })
                .collect::<Result<Vec<_>, Error>>()?;
            Ok(Document::Index(entries))
        }
        OCI_MANIFEST | DOCKER_MANIFEST => {
            if raw.manifests.is_some() {
                return Err(invalid(format!(
                    "{what} is an image manifest but has `manifests`: refusing an ambiguous \
                     manifest"
                )));
            }
            let (Some(config), Some(layers)) = (raw.config, raw.layers) else {
                return Err(invalid(format!(
                    "{what} is an image manifest without `config` or `layers`"
                )));
            };
            bounded(layers.len(), what)?;
            let config = descriptor(config, &format!("the config of {what}"))?;
            let layers = layers
                .into_iter()
                .enumerate()
                .map(|(i, d)| descriptor(d, &format!("layer {i} of {what}")))
                .collect::<Result<Vec<_>, Error>>()?;
            Ok(Document::Image(ImageManifest {
                media_type: media_type.to_string(),
                digest: Digest::of(bytes),
                config,
                layers,
            }))
        }
        other => Err(invalid(format!(
            "{what} is of media type {}: this client reads OCI image manifests and indexes and \
             Docker v2 schema 2 manifests and manifest lists",
            excerpt(other)
        ))),
    }
}

fn bounded(n: usize, what: &str) -> Result<(), Error> {
    if n > MAX_DESCRIPTORS {
        return Err(invalid(format!(
            "{what} lists {n} descriptors, more than {MAX_DESCRIPTORS}"
        )));
    }
    Ok(())
}

fn descriptor(d: RawDescriptor, what: &str) -> Result<Descriptor, Error> {
    let digest = Digest::parse(&d.digest).map_err(|e| invalid(format!("{what}: {e}")))?;
    let size =
        u64::try_from(d.size).map_err(|_| invalid(format!("{what}: negative size {}", d.size)))?;
    let m = &d.media_type;
    let ok = !m.is_empty()
        && m.len() <= MAX_MEDIA_TYPE
        && m.bytes().all(|b| b.is_ascii_graphic())
        && m.contains('/');
    if !ok {
        return Err(invalid(format!(
            "{what}: media type {} is not a media type",
            excerpt(m)
        )));
    }
    Ok(Descriptor {
        media_type: d.media_type,
        digest,
        size,
    })
}

/// The image of `entries` for `os`/`architecture`: the first one that
/// names that platform (without a variant first, as Docker picks).
pub fn pick<'a>(entries: &'a [IndexEntry], os: &str, architecture: &str) -> Option<&'a IndexEntry> {
    let matching = || {
        entries.iter().filter(|e| {
            e.platform
                .as_ref()
                .is_some_and(|p| p.os == os && p.architecture == architecture)
                && matches!(
                    e.descriptor.media_type.as_str(),
                    OCI_MANIFEST | DOCKER_MANIFEST
                )
        })
    };
    matching()
        .find(|e| e.platform.as_ref().is_some_and(|p| p.variant.is_none()))
        .or_else(|| matching().next())
}

/// serde_json's message without the input it quotes (at most its position).
fn json_error(e: &serde_json::Error) -> String {
    let s = e.to_string();
    let s: String = s.chars().take(200).collect();
    s.replace('\n', " ")
}

#[cfg(test)]
mod tests {
    use super::*;

    const D1: &str = "sha256:1111111111111111111111111111111111111111111111111111111111111111";
    const D2: &str = "sha256:2222222222222222222222222222222222222222222222222222222222222222";

    fn image(media: &str) -> String {
        format!(
            r#"{{"schemaVersion":2,"mediaType":"{media}",
              "config":{{"mediaType":"application/vnd.oci.image.config.v1+json","digest":"{D1}","size":7}},
              "layers":[{{"mediaType":"application/vnd.oci.image.layer.v1.tar","digest":"{D2}","size":42}}]}}"#
        )
    }

    fn err(bytes: &str, ct: Option<&str>) -> String {
        match parse(bytes.as_bytes(), ct, "the manifest") {
            Ok(d) => panic!("accepted {d:?}"),
            Err(e) => {
                assert_eq!(e.kind(), ErrorKind::Invalid);
                e.to_string()
            }
        }
    }

    #[test]
    fn image_manifests() {
        for media in [OCI_MANIFEST, DOCKER_MANIFEST] {
            let text = image(media);
            let Ok(Document::Image(m)) = parse(text.as_bytes(), Some(media), "m") else {
                panic!("not an image manifest");
            };
            assert_eq!(m.media_type, media);
            assert_eq!(m.digest, Digest::of(text.as_bytes()));
            assert_eq!(m.config.digest.as_str(), D1);
            assert_eq!(m.config.size, 7);
            assert_eq!(m.layers.len(), 1);
            assert_eq!(m.layers[0].digest.as_str(), D2);
            assert_eq!(m.layers[0].size, 42);
        }
        // Without mediaType in the body, the header tells.
        let text = image(OCI_MANIFEST).replace(
            r#""mediaType":"application/vnd.oci.image.manifest.v1+json","#,
            "",
        );
        assert!(matches!(
            parse(
                text.as_bytes(),
                Some("application/vnd.oci.image.manifest.v1+json; charset=x"),
                "m"
            ),
            Ok(Document::Image(_))
        ));
        assert!(matches!(
            parse(text.as_bytes(), None, "m"),
            Ok(Document::Image(_))
        ));
    }

    #[test]
    fn indexes_and_platforms() {
        let text = format!(
            r#"{{"schemaVersion":2,"mediaType":"{OCI_INDEX}","manifests":[
              {{"mediaType":"{OCI_MANIFEST}","digest":"{D1}","size":1,"platform":{{"os":"linux","architecture":"arm64"}}}},
              {{"mediaType":"{OCI_MANIFEST}","digest":"{D1}","size":2,"platform":{{"os":"linux","architecture":"amd64","variant":"v3"}}}},
              {{"mediaType":"{OCI_MANIFEST}","digest":"{D2}","size":3,"platform":{{"os":"linux","architecture":"amd64"}}}},
              {{"mediaType":"{OCI_MANIFEST}","digest":"{D2}","size":4}}]}}"#
        );
        let Ok(Document::Index(entries)) = parse(text.as_bytes(), None, "i") else {
            panic!("not an index");
        };
        assert_eq!(entries.len(), 4);
        assert_eq!(
            pick(&entries, "linux", "amd64").map(|e| e.descriptor.size),
            Some(3)
        );
        assert_eq!(
            pick(&entries, "linux", "arm64").map(|e| e.descriptor.size),
            Some(1)
        );
        assert_eq!(pick(&entries, "linux", "s390x"), None);
        // Only the variant there is: taken.
        assert_eq!(
            pick(&entries[..2], "linux", "amd64").map(|e| e.descriptor.size),
            Some(2)
        );
        let list = text.replace(OCI_INDEX, DOCKER_LIST);
        assert!(matches!(
            parse(list.as_bytes(), None, "i"),
            Ok(Document::Index(_))
        ));
    }

    #[test]
    fn refusals() {
        assert!(err("", None).contains("not a JSON manifest"));
        assert!(err("[]", None).contains("not a JSON manifest"));
        assert!(err(r#"{"schemaVersion":1}"#, None).contains("schemaVersion 1"));
        assert!(
            err(
                &image(OCI_MANIFEST).replace("\"schemaVersion\":2,", ""),
                None
            )
            .contains("(none)")
        );
        assert!(err(&image("text/plain"), None).contains("media type \"text/plain\""));
        assert!(err(&image(OCI_MANIFEST), Some(OCI_INDEX)).contains("ambiguous"));
        assert!(err(&image(OCI_INDEX), None).contains("ambiguous"));
        assert!(err(&image(OCI_MANIFEST).replace(&D2[7..], "ab"), None).contains("layer 0"));
        assert!(err(&image(OCI_MANIFEST).replace("42", "-1"), None).contains("negative size"));
        assert!(
            err(&image(OCI_MANIFEST).replace("sha256:1", "sha512:1"), None).contains("only sha256")
        );
        assert!(
            err(
                &image(OCI_MANIFEST).replace("application/vnd.oci.image.layer.v1.tar", "a b"),
                None
            )
            .contains("not a media type")
        );
        let many: Vec<String> = (0..=MAX_DESCRIPTORS)
            .map(|_| format!(r#"{{"mediaType":"a/b","digest":"{D2}","size":1}}"#))
            .collect();
        let text = format!(
            r#"{{"schemaVersion":2,"config":{{"mediaType":"a/b","digest":"{D1}","size":1}},"layers":[{}]}}"#,
            many.join(",")
        );
        assert!(err(&text, None).contains("more than 1024"));
        // Nothing of a long input in the message.
        let e = err(
            &format!(
                "{{\"schemaVersion\":2,\"mediaType\":\"{}\"}}",
                "x".repeat(1000)
            ),
            None,
        );
        assert!(e.len() < 300, "{e}");
    }
}
