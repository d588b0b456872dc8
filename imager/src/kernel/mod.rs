//! Kernel: config fragments, KSPP audit, cached build.
//!
//! - [`config`]: Kconfig `.config` / fragment parse, merge, compare.
//! - [`audit`]: the KSPP rule table, waivers and the audit report.
//! - [`build`]: the cached, reproducible `bzImage` build.
//! - [`command`]: what `imager kernel build|check` do.

pub mod audit;
pub mod build;
pub mod command;
pub mod config;

pub use audit::{Report, Rules, Verdict, Waiver, audit};
pub use build::{BuiltKernel, KernelRequest, build, default_cache_dir};
pub use config::KernelConfig;
