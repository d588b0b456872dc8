//! Kernel: config fragments, KSPP audit, cached build.
//!
//! - [`config`]: Kconfig `.config` / fragment parse, merge, compare.
//! - [`audit`]: the KSPP rule table, waivers and the audit report.
//! - [`build`]: the cached, reproducible `bzImage` build.
//! - [`cli`]: `imager kernel build|check`.

pub mod audit;
pub mod build;
pub mod cli;
pub mod config;

pub use audit::{Report, Rules, Verdict, Waiver, audit};
pub use build::{BuiltKernel, KernelRequest, build, default_cache_dir};
pub use cli::KernelCommand;
pub use config::KernelConfig;
