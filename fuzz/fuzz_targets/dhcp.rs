//! DHCP replies (`contract::dhcp`): the bytes a server on the node's link
//! sends, read by the runtime's DHCP client. A reply parses or is refused,
//! never a panic; what it keeps passed its checks; the lease it gives
//! keeps its timers in order.
#![no_main]
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    // The transaction and hardware address of the seeds.
    let client = contract::dhcp::Client {
        xid: 0x1234_5678,
        mac: [0x52, 0x54, 0, 0x12, 0x34, 0x56],
    };
    let Ok(r) = contract::dhcp::parse_reply(data, &client) else {
        return;
    };
    assert!(r.routers.len() <= contract::dhcp::MAX_SERVERS);
    assert!(r.dns.len() <= contract::dhcp::MAX_SERVERS);
    assert!(r.mtu.is_none_or(|m| m >= contract::dhcp::MIN_MTU));
    if let Some(h) = &r.hostname {
        assert!(contract::settings::check_hostname(h).is_ok());
    }
    for i in &r.ignored {
        assert!(i.chars().all(|c| !c.is_control()), "{i:?}");
    }
    if let Ok(l) = contract::dhcp::Lease::from_ack(&r, std::net::Ipv4Addr::new(10, 0, 2, 2)) {
        assert!(l.renewal <= l.rebinding && l.rebinding <= l.lease);
        assert!(l.lease >= contract::dhcp::MIN_LEASE);
        let _ = l.phase(l.renewal);
    }
});
