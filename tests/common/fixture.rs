//! Shared fixtures of a test file: built once, by the first test that asks;
//! a build that fails is remembered with its log, and every test that asks
//! after it fails at once with that log instead of building again.
//!
//! `OnceLock::get_or_init` alone retries a build that panicked: each test
//! of the file would build again and fail again, turning one broken build
//! into many (13 tests × 3 builds in tests/upgrade.rs) and a CI timeout.
//!
//! std only: `tests/harness.rs` compiles this file into a throwaway crate
//! to show a broken fixture failing its file in seconds.

use std::panic::{AssertUnwindSafe, catch_unwind};
use std::sync::OnceLock;

/// A value built once per test binary, or the failure of its one build.
pub struct Fixture<T> {
    name: &'static str,
    cell: OnceLock<Result<T, String>>,
}

impl<T> Fixture<T> {
    pub const fn new(name: &'static str) -> Self {
        Fixture {
            name,
            cell: OnceLock::new(),
        }
    }

    /// The fixture, built by `build` if no test built it before. A panic of
    /// `build` (a failed command's assertion, with its output) fails this
    /// test with it, and every later test of the file with the same text,
    /// without another build.
    pub fn get(&self, build: impl FnOnce() -> T) -> &T {
        let r = self.cell.get_or_init(|| {
            eprintln!("fixture {}: building", self.name);
            catch_unwind(AssertUnwindSafe(build)).map_err(|p| panic_text(p.as_ref()))
        });
        match r {
            Ok(v) => v,
            Err(log) => panic!(
                "fixture {} failed to build (once for this file; not retried):\n{log}",
                self.name
            ),
        }
    }
}

/// What a panic said: its message when it was a string.
pub fn panic_text(p: &(dyn std::any::Any + Send)) -> String {
    if let Some(s) = p.downcast_ref::<String>() {
        s.clone()
    } else if let Some(s) = p.downcast_ref::<&str>() {
        (*s).to_string()
    } else {
        "(a panic without a message)".to_string()
    }
}
