//! Registry authentication's parsers of untrusted bytes: the
//! `WWW-Authenticate` challenges a registry sends
//! (`registry::auth::parse_challenges`), a token service's reply
//! (`parse_token_reply`), an auth file (`registry::authfile::parse`: a
//! host's file, read as the ecosystem writes it) and a credential helper's
//! answer (`parse_helper_output`). The first byte picks the parser. Any
//! bytes give a value or an error, never a panic; what is accepted keeps
//! the documented bounds, and no message quotes a secret. Seeds:
//! `fuzz/seeds/registry_auth/`.
#![no_main]
use libfuzzer_sys::fuzz_target;
use registry::auth;

fuzz_target!(|data: &[u8]| {
    let Some((&which, rest)) = data.split_first() else {
        return;
    };
    match which % 4 {
        0 => {
            let Ok(text) = std::str::from_utf8(rest) else {
                return;
            };
            match auth::parse_challenges(text) {
                Ok(cs) => {
                    assert!(!cs.is_empty() && cs.len() <= auth::MAX_CHALLENGES);
                    for c in &cs {
                        assert!(c.params.len() <= auth::MAX_PARAMS);
                        assert!(!c.scheme.is_empty());
                        assert!(
                            c.params
                                .iter()
                                .all(|(_, v)| !v.chars().any(char::is_control))
                        );
                    }
                }
                Err(e) => assert!(e.to_string().len() < 1024, "a long message: {e}"),
            }
        }
        1 => match auth::parse_token_reply(rest, "t") {
            Ok(t) => {
                assert!(t.token.len() <= auth::MAX_TOKEN);
                assert!(t.token.bytes().all(|b| (0x21..=0x7e).contains(&b)));
                assert!(t.lifetime >= auth::DEFAULT_TOKEN_LIFETIME);
                // Debug never shows the token.
                assert_eq!(
                    format!("{t:?}"),
                    format!(
                        "TokenReply {{ token: \"(hidden)\", lifetime: {:?} }}",
                        t.lifetime
                    )
                );
            }
            Err(e) => assert!(e.to_string().len() < 1024, "a long message: {e}"),
        },
        2 => {
            // The registry and name asked about come from the input too.
            let (head, file) = rest.split_at(rest.len().min(32));
            let head = String::from_utf8_lossy(head);
            let (registry, name) = head.split_once('/').unwrap_or((&head, "a"));
            match registry::authfile::parse(file, "f", registry, name) {
                Ok(Some(registry::authfile::Entry::Credentials(c))) => {
                    // Debug shows the user name, never the secret.
                    if let registry::Credentials::Basic { username, .. } = &c {
                        assert_eq!(
                            format!("{c:?}"),
                            format!("Basic {{ username: {username:?}, password: \"(hidden)\" }}")
                        );
                    }
                }
                Ok(_) => {}
                Err(e) => assert!(e.to_string().len() < 1024, "a long message: {e}"),
            }
        }
        _ => {
            if let Ok(registry::Credentials::Basic { username, password }) =
                registry::authfile::parse_helper_output(rest)
            {
                assert!(!username.contains(':') && !password.is_empty());
            }
        }
    }
});
