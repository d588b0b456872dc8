//! The command line's argument structs (clap) of the `imager` binary, turned
//! into the library's plain options.

pub mod kernel;
pub mod node;
pub mod secureboot;
pub mod sign;
