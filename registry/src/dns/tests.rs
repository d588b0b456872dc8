use super::*;

/// An answer to `query(id, name)`: the header's flags and the records
/// (already encoded) after the echoed question.
fn answer(id: u16, name: &str, flags: u16, records: &[Vec<u8>]) -> Vec<u8> {
    let Ok(q) = query(id, name) else {
        panic!("a query");
    };
    let mut m = q.clone();
    m[2..4].copy_from_slice(&flags.to_be_bytes());
    m[6..8].copy_from_slice(&(records.len() as u16).to_be_bytes());
    for r in records {
        m.extend_from_slice(r);
    }
    m
}

/// A record owned by the name at offset `owner` (a compression pointer).
fn record(owner: u16, rtype: u16, data: &[u8]) -> Vec<u8> {
    let mut r = (0xc000 | owner).to_be_bytes().to_vec();
    r.extend_from_slice(&rtype.to_be_bytes());
    r.extend_from_slice(&CLASS_IN.to_be_bytes());
    r.extend_from_slice(&300u32.to_be_bytes());
    r.extend_from_slice(&(data.len() as u16).to_be_bytes());
    r.extend_from_slice(data);
    r
}

fn encode(name: &str) -> Vec<u8> {
    let mut v = Vec::new();
    for l in name.split('.') {
        v.push(l.len() as u8);
        v.extend_from_slice(l.as_bytes());
    }
    v.push(0);
    v
}

#[test]
fn queries_are_standard_recursive_a_queries() {
    let Ok(q) = query(0x1234, "Registry.Example.") else {
        panic!("a query");
    };
    assert_eq!(
        q,
        [
            &[0x12, 0x34, 1, 0, 0, 1, 0, 0, 0, 0, 0, 0][..],
            b"\x08registry\x07example\x00\x00\x01\x00\x01"
        ]
        .concat()
    );
    for bad in [
        "",
        "a..b",
        "a b",
        &"a".repeat(64),
        &format!("{}.x", "a.".repeat(130)),
    ] {
        assert!(query(1, bad).is_err(), "{bad:?}");
    }
}

#[test]
fn addresses_directly_and_through_cnames() {
    let a = answer(
        7,
        "reg.example",
        0x8180,
        &[record(12, TYPE_A, &[10, 0, 2, 2])],
    );
    assert_eq!(
        parse_answer(&a, 7, "REG.example.").ok(),
        Some(Answer::Addresses(vec![Ipv4Addr::new(10, 0, 2, 2)]))
    );
    // reg.example CNAME cdn.example.net; cdn.example.net A 192.0.2.1, 192.0.2.2.
    let mut m = answer(7, "reg.example", 0x8180, &[]);
    let cname_at = m.len() + 12;
    let mut c = record(12, TYPE_CNAME, &encode("cdn.example.net"));
    m.append(&mut c);
    m.append(&mut record(cname_at as u16, TYPE_A, &[192, 0, 2, 1]));
    m.append(&mut record(cname_at as u16, TYPE_A, &[192, 0, 2, 2]));
    m[6..8].copy_from_slice(&3u16.to_be_bytes());
    assert_eq!(
        parse_answer(&m, 7, "reg.example").ok(),
        Some(Answer::Addresses(vec![
            Ipv4Addr::new(192, 0, 2, 1),
            Ipv4Addr::new(192, 0, 2, 2)
        ]))
    );
    // Records of other names are not the name's.
    let other = answer(
        7,
        "reg.example",
        0x8180,
        &[record(16, TYPE_A, &[1, 2, 3, 4])],
    );
    assert_eq!(
        parse_answer(&other, 7, "reg.example").ok(),
        Some(Answer::NoSuchName)
    );
}

#[test]
fn codes_and_refusals() {
    let p = |m: &[u8]| parse_answer(m, 7, "reg.example");
    assert_eq!(
        p(&answer(7, "reg.example", 0x8183, &[])).ok(),
        Some(Answer::NoSuchName)
    );
    assert_eq!(
        p(&answer(7, "reg.example", 0x8182, &[])).ok(),
        Some(Answer::ServerFailed(2))
    );
    assert_eq!(
        p(&answer(7, "reg.example", 0x8380, &[])).ok(),
        Some(Answer::Truncated)
    );
    for refused in [
        answer(8, "reg.example", 0x8180, &[]),   // another ID
        answer(7, "reg.example", 0x0100, &[]),   // a query, not an answer
        answer(7, "other.example", 0x8180, &[]), // another question
        answer(7, "reg.example", 0x8180, &[])[..11].to_vec(),
        answer(
            7,
            "reg.example",
            0x8180,
            &[record(12, TYPE_A, &[1, 2, 3, 4])],
        )[..40]
            .to_vec(),
    ] {
        assert!(p(&refused).is_err(), "{refused:?}");
    }
    // A compression loop: a record owned by a pointer to itself.
    let mut m = answer(7, "reg.example", 0x8180, &[]);
    let at = m.len() as u16;
    m.extend_from_slice(&(0xc000 | at).to_be_bytes());
    m.extend_from_slice(&[0, 1, 0, 1, 0, 0, 0, 0, 0, 4, 1, 2, 3, 4]);
    m[6..8].copy_from_slice(&1u16.to_be_bytes());
    let Err(e) = p(&m) else {
        panic!("a loop accepted");
    };
    assert!(e.to_string().contains("loop"), "{e}");
    // A CNAME chain that loops: bounded.
    let mut m = answer(7, "reg.example", 0x8180, &[]);
    m.append(&mut record(12, TYPE_CNAME, &[0xc0, 12]));
    m[6..8].copy_from_slice(&1u16.to_be_bytes());
    assert!(p(&m).is_err());
    let mut m = answer(7, "reg.example", 0x8180, &[]);
    m[6..8].copy_from_slice(&(MAX_RECORDS as u16 + 1).to_be_bytes());
    assert!(p(&m).is_err());
}

/// A DNS server on 127.0.0.1 (UDP, and TCP on the same port) answering
/// each query with `reply(query)`; its address.
/// How a test server answers a query.
type Reply = fn(&[u8]) -> Vec<u8>;

fn server(reply: Reply, tcp: Option<Reply>) -> SocketAddr {
    let Ok(udp) = UdpSocket::bind("127.0.0.1:0") else {
        panic!("a UDP socket");
    };
    let Ok(addr) = udp.local_addr() else {
        panic!("its address");
    };
    std::thread::spawn(move || {
        let mut buf = [0u8; 512];
        while let Ok((n, from)) = udp.recv_from(&mut buf) {
            let _ = udp.send_to(&reply(&buf[..n]), from);
        }
    });
    if let Some(tcp_reply) = tcp {
        let Ok(l) = std::net::TcpListener::bind(addr) else {
            panic!("a TCP listener on {addr}");
        };
        std::thread::spawn(move || {
            for s in l.incoming() {
                let Ok(mut s) = s else { continue };
                let mut len = [0u8; 2];
                if s.read_exact(&mut len).is_err() {
                    continue;
                }
                let mut q = vec![0u8; u16::from_be_bytes(len) as usize];
                if s.read_exact(&mut q).is_err() {
                    continue;
                }
                let a = tcp_reply(&q);
                let _ = s.write_all(&(a.len() as u16).to_be_bytes());
                let _ = s.write_all(&a);
            }
        });
    }
    addr
}

/// The answer to query `q` with the records given (the question echoed).
fn reply_with(q: &[u8], flags: u16, records: &[Vec<u8>]) -> Vec<u8> {
    let mut m = q.to_vec();
    m[2..4].copy_from_slice(&flags.to_be_bytes());
    m[6..8].copy_from_slice(&(records.len() as u16).to_be_bytes());
    for r in records {
        m.extend_from_slice(r);
    }
    m
}

#[test]
fn lookups_use_host_entries_then_each_server_then_tcp() {
    let resolver = |servers: Vec<SocketAddr>| Resolver {
        hosts: BTreeMap::from([("reg.local".into(), vec![Ipv4Addr::new(10, 0, 2, 2)])]),
        servers,
        timeout: Duration::from_millis(500),
        trusted_names: Vec::new(),
    };
    let good = server(
        |q| reply_with(q, 0x8180, &[record(12, TYPE_A, &[10, 9, 8, 7])]),
        None,
    );
    let failing = server(|q| reply_with(q, 0x8182, &[]), None);
    let forged_then_good = server(
        |q| {
            // Another ID first is read past; then nothing: the retry gets
            // no better. (One datagram per query.)
            let mut m = reply_with(q, 0x8180, &[record(12, TYPE_A, &[6, 6, 6, 6])]);
            m[0] ^= 0xff;
            m
        },
        None,
    );
    let truncating = server(
        |q| reply_with(q, 0x8380, &[]),
        Some(|q| reply_with(q, 0x8180, &[record(12, TYPE_A, &[10, 1, 1, 1])])),
    );
    let r = resolver(vec![failing, good]);
    assert_eq!(
        r.lookup("REG.local").ok(),
        Some(vec![IpAddr::from([10, 0, 2, 2])])
    );
    assert_eq!(
        r.lookup("10.0.2.9").ok(),
        Some(vec![IpAddr::from([10, 0, 2, 9])])
    );
    assert_eq!(
        r.lookup("registry.test").ok(),
        Some(vec![IpAddr::from([10, 9, 8, 7])])
    );
    let r = resolver(vec![truncating]);
    assert_eq!(
        r.lookup("registry.test").ok(),
        Some(vec![IpAddr::from([10, 1, 1, 1])])
    );
    let r = resolver(vec![forged_then_good]);
    let Err(e) = r.lookup("registry.test") else {
        panic!("a forged answer accepted");
    };
    assert!(e.to_string().contains("cannot resolve"), "{e}");
    let Err(e) = resolver(Vec::new()).lookup("registry.test") else {
        panic!("resolved without a server");
    };
    assert!(e.to_string().contains("no DNS server"), "{e}");
    let nx = server(|q| reply_with(q, 0x8183, &[]), None);
    let Err(e) = resolver(vec![nx]).lookup("registry.test") else {
        panic!("NXDOMAIN resolved");
    };
    assert!(e.to_string().contains("no such host"), "{e}");
}
