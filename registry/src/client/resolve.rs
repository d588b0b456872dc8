//! The client's name resolution when the caller gives a
//! [`crate::dns::Resolver`] (the node, which has no system resolver): an
//! implementation of ureq's resolver trait over it. ureq's resolver
//! interface is in its `unversioned` module (exempt from semver): the
//! version is pinned by Cargo.lock, and this is its one use.

use crate::dns;
use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;
use ureq::http::Uri;
use ureq::unversioned::resolver::{ResolvedSocketAddrs, Resolver};
use ureq::unversioned::transport::NextTimeout;

/// The resolver, and the addresses a name may not lead to unless a host
/// entry says so (this machine's: [`super::Options::own_addresses`]).
#[derive(Debug)]
pub(super) struct Names(pub(super) Arc<dns::Resolver>, pub(super) Vec<IpAddr>);

/// Whether a DNS server's answer leads where no registry is: this
/// machine (loopback, unspecified, its own addresses), link-local (where
/// clouds serve instance metadata) or multicast. A forged or hostile answer
/// could otherwise send a pull, and its credentials, there.
fn forbidden(a: IpAddr, own: &[IpAddr]) -> bool {
    own.contains(&a)
        || match a {
            IpAddr::V4(v4) => {
                v4.is_loopback()
                    || v4.is_unspecified()
                    || v4.is_link_local()
                    || v4.is_multicast()
                    || v4.is_broadcast()
            }
            IpAddr::V6(v6) => {
                v6.is_loopback()
                    || v6.is_unspecified()
                    || v6.is_multicast()
                    || v6.is_unicast_link_local()
            }
        }
}

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
        let refuse =
            |why: String| ureq::Error::Io(std::io::Error::new(std::io::ErrorKind::NotFound, why));
        let addrs = self.0.lookup(host).map_err(|e| refuse(e.to_string()))?;
        // Literals, the node's own host entries and the names the operator
        // gave are the operator's; a DNS server's answer for any other name
        // (a redirect's, a token realm's) is checked.
        let name = host.trim_end_matches('.').to_ascii_lowercase();
        let by_dns = host.parse::<IpAddr>().is_err()
            && !self.0.hosts.contains_key(&name)
            && !self.0.trusted_names.contains(&name);
        if by_dns && let Some(a) = addrs.iter().find(|a| forbidden(**a, &self.1)) {
            return Err(refuse(format!(
                "the DNS answer for {} is {a}: this machine, a link-local or a multicast \
                 address: refused",
                contract::text::excerpt(host)
            )));
        }
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
