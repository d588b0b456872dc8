//! The node API's pending connections: those that have not sent their
//! request yet (the TLS handshake and the request line; anyone can open
//! one). At most [`MAX_PENDING`] are kept, and at most
//! [`MAX_PENDING_PER_PEER`] of one address. A newcomer closes the oldest
//! pending connection of its own address when that address holds its
//! share; else, when all are taken, the oldest of the address that holds
//! the most. So idle or dripping connections cannot lock clients out (they
//! only make the attacker reopen them), and one address flooding the node
//! closes only its own connections, never those of a client elsewhere.
//! (Behind NAT, or QEMU's user network, every client has the same
//! address: the newest still wins there, as with the global bound alone.)

use nodeapi::proto::{MAX_PENDING, MAX_PENDING_PER_PEER};
use std::collections::VecDeque;
use std::net::{IpAddr, TcpStream};

// One address alone never fills the node.
const _: () = assert!(MAX_PENDING_PER_PEER < MAX_PENDING);

/// The pending connections, oldest first: an id, the peer's address and a
/// handle that closes the connection.
#[derive(Default)]
pub struct Pending(VecDeque<(u64, IpAddr, TcpStream)>);

impl Pending {
    /// Admits connection `id` from `peer`; the handle of the connection it
    /// closes, if one must go (closing it is the caller's: its thread's
    /// next read fails, and it ends).
    pub fn admit(&mut self, id: u64, peer: IpAddr, handle: TcpStream) -> Option<TcpStream> {
        let peers: Vec<IpAddr> = self.0.iter().map(|(_, p, _)| *p).collect();
        let closed = victim(&peers, peer).and_then(|i| self.0.remove(i));
        self.0.push_back((id, peer, handle));
        closed.map(|(_, _, h)| h)
    }

    /// Forgets connection `id` (served, or ended).
    pub fn remove(&mut self, id: u64) {
        self.0.retain(|(i, _, _)| *i != id);
    }
}

/// Which of the pending connections from `peers` (oldest first) a newcomer
/// from `peer` closes, by index; see the module doc.
fn victim(peers: &[IpAddr], peer: IpAddr) -> Option<usize> {
    let count = |p: &IpAddr| peers.iter().filter(|q| *q == p).count();
    if count(&peer) >= MAX_PENDING_PER_PEER {
        return peers.iter().position(|p| *p == peer);
    }
    if peers.len() < MAX_PENDING {
        return None;
    }
    // The address holding the most; of those, the one whose oldest
    // connection is oldest (the first found, scanning oldest first).
    let most = peers.iter().max_by_key(|p| count(p))?;
    let most = peers.iter().find(|p| count(p) == count(most))?;
    peers.iter().position(|p| p == most)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ip(n: u8) -> IpAddr {
        IpAddr::from([10, 0, 0, n])
    }

    /// One address never holds more than its share: its newcomer closes
    /// its own oldest, and a full node closes a connection of the address
    /// holding the most, never a lone client's.
    #[test]
    fn a_flooding_address_closes_only_its_own_connections() {
        let mut peers = Vec::new();
        for _ in 0..MAX_PENDING_PER_PEER {
            assert_eq!(victim(&peers, ip(1)), None);
            peers.push(ip(1));
        }
        // ip(1) holds its share: its next connection closes its oldest.
        peers.insert(1, ip(2));
        assert_eq!(victim(&peers, ip(1)), Some(0));
        assert_eq!(victim(&peers, ip(3)), None);
        // Full: 8 of ip(1), then ip(2), and 7 others of ip(3).
        while peers.len() < MAX_PENDING {
            peers.push(ip(3));
        }
        // A newcomer of a fourth address closes ip(1)'s oldest (the most).
        assert_eq!(victim(&peers, ip(4)), Some(0));
        // ip(2)'s connection is never the one closed while others hold more.
        for newcomer in [ip(3), ip(4), ip(5)] {
            let i = victim(&peers, newcomer).unwrap();
            assert_ne!(peers[i], ip(2), "{newcomer}");
        }
        // Tied: the address whose oldest connection is oldest.
        let tied = [ip(5), ip(6), ip(6), ip(5)];
        let mut full: Vec<IpAddr> = Vec::new();
        for i in 0..MAX_PENDING {
            full.push(tied[i % 4]);
        }
        assert_eq!(victim(&full, ip(7)), Some(0));
    }

    /// Everyone behind one address (NAT, QEMU's user network): the newest
    /// wins, the oldest goes.
    #[test]
    fn behind_one_address_the_newest_wins() {
        let peers = vec![ip(1); MAX_PENDING_PER_PEER];
        assert_eq!(victim(&peers, ip(1)), Some(0));
    }
}
