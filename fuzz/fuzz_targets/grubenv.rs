//! GRUB's environment block and grub.cfg's first sector as the runtime and
//! the installer read them from BOOT: any bytes give variables or "not a
//! block", never a panic; a block read exactly renders back to the same
//! bytes; any value escaped as GRUB escapes it reads back (to its first
//! NUL, as GRUB's strings do).
#![no_main]
use contract::grubcfg;
use contract::grubenv::{self, GrubEnv, SIGNATURE};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let _ = grubenv::variables(data);
    if let Ok(env) = GrubEnv::read(data) {
        let block = env.render().expect("a block read renders");
        assert_eq!(GrubEnv::read(&block), Ok(env));
        assert_eq!(GrubEnv::read_exact(&block), Some(env));
        let _ = grubcfg::next_boot(grubcfg::read_good(data), env);
    }
    if let Some(env) = GrubEnv::read_exact(data) {
        assert_eq!(env.render().ok().as_deref(), Some(data));
    }
    let mut block = SIGNATURE.to_vec();
    block.extend_from_slice(b"x=");
    block.extend_from_slice(&grubenv::escape(data));
    block.push(b'\n');
    let vars = grubenv::variables(&block).expect("a block");
    let value = data.split(|&b| b == 0).next().unwrap_or_default();
    assert_eq!(vars, [(b"x".to_vec(), value.to_vec())]);
});
