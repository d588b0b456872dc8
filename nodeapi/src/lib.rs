//! The node API's security contract, shared by machined (the server, in the
//! runtime) and imager (the client, `imager node …`): mutual TLS 1.3 whose
//! only root is the cluster CA, and the role a client certificate carries.
//!
//! - [`role`]: the roles (`reader`, `operator`, `admin`), how a certificate
//!   names one (its subject's organization, `imager:<role>`) and what each
//!   may call;
//! - [`proto`]: the messages (JSON lines: a request, then events);
//! - [`tls`]: the rustls configurations of both ends (TLS 1.3 only, the
//!   `ring` provider, no OpenSSL) and the role of the peer of a connection.

pub mod proto;
pub mod role;
pub mod tls;

pub use role::{Op, Role};
