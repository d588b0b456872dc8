//! The client side of the node API (`imager node …`): the cluster's
//! credentials ([`credentials`]). The API's security contract, shared with
//! machined, is the `nodeapi` crate.

pub mod credentials;
