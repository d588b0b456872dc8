//! Kernel: config fragments, KSPP audit, cached build.
