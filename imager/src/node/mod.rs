//! The client side of the node API (`imager node …`): the cluster's
//! credentials ([`credentials`]), a disk's node credentials
//! ([`provision`]), and the client ([`client`]). The API's security contract, shared with
//! machined, is the `nodeapi` crate.

pub mod client;
pub mod credentials;
pub mod fleet;
pub mod provision;
