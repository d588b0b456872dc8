//! The client's name resolution when the caller gives a
//! [`crate::dns::Resolver`] (the node, which has no system resolver): an
//! implementation of ureq's resolver trait over it. ureq's resolver
//! interface is in its `unversioned` module (exempt from semver): the
//! version is pinned by Cargo.lock, and this is its one use.

use crate::dns;
use std::net::SocketAddr;
use std::sync::Arc;
use ureq::http::Uri;
use ureq::unversioned::resolver::{ResolvedSocketAddrs, Resolver};
use ureq::unversioned::transport::NextTimeout;

#[derive(Debug)]
pub(super) struct Names(pub(super) Arc<dns::Resolver>);

impl Resolver for Names {
    fn resolve(
        &self,
        uri: &Uri,
        _config: &ureq::config::Config,
        _timeout: NextTimeout,
    ) -> Result<ResolvedSocketAddrs, ureq::Error> {
        let host = uri.host().ok_or(ureq::Error::HostNotFound)?;
        let port = uri
            .port_u16()
            .unwrap_or(if uri.scheme_str() == Some("http") {
                80
            } else {
                443
            });
        // The resolver's own bounds apply (a few seconds per server).
        let addrs = self.0.lookup(host).map_err(|e| {
            ureq::Error::Io(std::io::Error::new(
                std::io::ErrorKind::NotFound,
                e.to_string(),
            ))
        })?;
        let mut out = self.empty();
        for a in addrs {
            // At most ureq's 16 addresses.
            if out.try_push(SocketAddr::new(a, port)).is_err() {
                break;
            }
        }
        if out.is_empty() {
            return Err(ureq::Error::HostNotFound);
        }
        Ok(out)
    }
}
