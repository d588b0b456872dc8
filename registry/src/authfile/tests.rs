use super::*;

fn creds(user: &str, password: &str) -> Entry {
    match Credentials::basic(user, password) {
        Ok(c) => Entry::Credentials(c),
        Err(e) => panic!("{e}"),
    }
}

fn b64(s: &str) -> String {
    base64::engine::general_purpose::STANDARD.encode(s)
}

fn parsed(file: &str, registry: &str, name: &str) -> Option<Entry> {
    match parse(file.as_bytes(), "auth.json", registry, name) {
        Ok(e) => e,
        Err(e) => panic!("{e}"),
    }
}

#[test]
fn docker_config_keys_as_docker_writes_them() {
    let file = format!(
        r#"{{"auths":{{"https://index.docker.io/v1/":{{"auth":"{}"}},"ghcr.io":{{"auth":"{}"}},"http://Reg.Example:5000/v2/":{{"identitytoken":"rt"}}}}}}"#,
        b64("hub:pw1"),
        b64("gh:ghp_x:y")
    );
    assert_eq!(
        parsed(&file, "docker.io", "library/alpine"),
        Some(creds("hub", "pw1"))
    );
    assert_eq!(
        parsed(&file, "registry-1.docker.io", "a/b"),
        Some(creds("hub", "pw1"))
    );
    // The password is everything after the first colon.
    assert_eq!(
        parsed(&file, "ghcr.io", "o/r"),
        Some(creds("gh", "ghp_x:y"))
    );
    assert_eq!(
        parsed(&file, "reg.example:5000", "x"),
        Some(Entry::Credentials(Credentials::IdentityToken("rt".into())))
    );
    assert_eq!(parsed(&file, "quay.io", "x"), None);
    assert_eq!(parsed(&file, "reg.example:5001", "x"), None);
}

#[test]
fn the_most_specific_key_wins_as_in_containers_auth_json() {
    let file = format!(
        r#"{{"auths":{{"reg.example":{{"auth":"{}"}},"reg.example/team":{{"auth":"{}"}},"reg.example/team/app":{{"auth":"{}"}}}}}}"#,
        b64("all:1"),
        b64("team:2"),
        b64("app:3")
    );
    assert_eq!(
        parsed(&file, "reg.example", "team/app"),
        Some(creds("app", "3"))
    );
    assert_eq!(
        parsed(&file, "reg.example", "team/app2"),
        Some(creds("team", "2"))
    );
    assert_eq!(
        parsed(&file, "reg.example", "team/x/y"),
        Some(creds("team", "2"))
    );
    assert_eq!(
        parsed(&file, "reg.example", "other"),
        Some(creds("all", "1"))
    );
    // A name's prefix that is not a whole component does not match.
    assert_eq!(
        parsed(&file, "reg.example", "teamwork"),
        Some(creds("all", "1"))
    );
}

#[test]
fn helpers_named_per_registry_or_for_all() {
    let file = format!(
        r#"{{"auths":{{"ghcr.io":{{}},"quay.io":{{"auth":"{}"}}}},"credHelpers":{{"123.dkr.ecr.us-east-1.amazonaws.com":"ecr-login"}},"credsStore":"pass"}}"#,
        b64("q:1")
    );
    assert_eq!(
        parsed(&file, "123.dkr.ecr.us-east-1.amazonaws.com", "app"),
        Some(Entry::Helper("ecr-login".into()))
    );
    assert_eq!(
        parsed(&file, "ghcr.io", "a"),
        Some(Entry::Helper("pass".into()))
    );
    assert_eq!(parsed(&file, "quay.io", "a"), Some(creds("q", "1")));
    for bad in ["../x", "a/b", ".hidden", "", "a b"] {
        let file = format!(r#"{{"credsStore":"{bad}"}}"#);
        let r = parse(file.as_bytes(), "f", "r.io", "a");
        assert!(r.is_err() || bad.is_empty(), "{bad:?}: {r:?}");
    }
}

#[test]
fn bad_files_are_refused_without_showing_secrets() {
    for (file, want) in [
        ("not json s3cret".to_string(), "not a valid auth file"),
        (
            r#"{"auths":{"r.io":"s3cretb64"}}"#.to_string(),
            "not a valid auth file",
        ),
        (
            r#"{"auths":{"r.io":{"auth":"!!s3cret"}}}"#.into(),
            "not base64",
        ),
        (
            format!(
                r#"{{"auths":{{"r.io":{{"auth":"{}"}}}}}}"#,
                b64("nocolons3cret")
            ),
            "not base64 of user:password",
        ),
        (
            format!(
                r#"{{"auths":{{"r.io":{{"auth":"{}"}}}}}}"#,
                b64("u:s3cret\n")
            ),
            "control",
        ),
    ] {
        let Err(e) = parse(file.as_bytes(), "f.json", "r.io", "a") else {
            panic!("{file} accepted");
        };
        let m = e.to_string();
        assert!(m.contains(want) && m.starts_with("f.json"), "{m}");
        assert!(!m.contains("s3cret"), "{m}");
    }
    let big = vec![b' '; MAX_AUTH_FILE as usize + 1];
    assert!(parse(&big, "f", "r.io", "a").is_err());
}

#[test]
fn files_are_searched_in_order_and_an_explicit_one_must_exist() {
    let Ok(dir) = tempfile::tempdir() else {
        panic!("a temporary directory");
    };
    let first = dir.path().join("first.json");
    let second = dir.path().join("second.json");
    let missing = dir.path().join("missing.json");
    let write = |p: &Path, s: String| {
        if let Err(e) = std::fs::write(p, s) {
            panic!("{e}");
        }
    };
    write(&first, r#"{"auths":{"other.io":{"auth":"eDp5"}}}"#.into());
    write(
        &second,
        format!(r#"{{"auths":{{"r.io":{{"auth":"{}"}}}}}}"#, b64("u:p")),
    );
    let files = vec![missing.clone(), first, second.clone()];
    let Ok(Some(found)) = lookup(&files, false, "r.io", "a") else {
        panic!("found");
    };
    assert_eq!(
        found.credentials,
        Credentials::Basic {
            username: "u".into(),
            password: "p".into()
        }
    );
    assert_eq!(found.source, second.display().to_string());
    assert!(matches!(lookup(&files, false, "none.io", "a"), Ok(None)));
    let Err(e) = lookup(&[missing], true, "r.io", "a") else {
        panic!("a missing explicit file accepted");
    };
    assert!(e.to_string().contains("missing.json"), "{e}");
}

#[test]
fn a_credential_helper_speaks_the_helper_protocol() {
    use std::os::unix::fs::PermissionsExt;
    let Ok(dir) = tempfile::tempdir() else {
        panic!("a temporary directory");
    };
    let helper = |name: &str, body: &str| -> PathBuf {
        let p = dir.path().join(name);
        let script = format!("#!/bin/sh\n{body}\n");
        if std::fs::write(&p, script)
            .and_then(|()| std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o755)))
            .is_err()
        {
            panic!("writing {name}");
        }
        p
    };
    // It reads the server from stdin and answers for that one only.
    let ok = helper(
        "ok",
        r#"test "$1" = get || exit 3
read server
if [ "$server" = "r.io:5000" ]; then echo '{"ServerURL":"r.io:5000","Username":"u","Secret":"p"}'
elif [ "$server" = "https://index.docker.io/v1/" ]; then echo '{"Username":"<token>","Secret":"rt"}'
else echo "credentials not found in native keychain"; exit 1; fi"#,
    );
    assert_eq!(
        run_program(&ok, "r.io:5000").ok().flatten(),
        Some(Credentials::Basic {
            username: "u".into(),
            password: "p".into()
        })
    );
    assert_eq!(
        run_program(&ok, "docker.io").ok().flatten(),
        Some(Credentials::IdentityToken("rt".into()))
    );
    assert!(matches!(run_program(&ok, "other.io"), Ok(None)));
    let garbage = helper("garbage", "echo 's3cret not json'");
    let Err(e) = run_program(&garbage, "r.io") else {
        panic!("garbage accepted");
    };
    assert!(!e.to_string().contains("s3cret"), "{e}");
    let Err(e) = run_program(&dir.path().join("absent"), "r.io") else {
        panic!("a missing helper accepted");
    };
    assert!(e.to_string().contains("cannot run it"), "{e}");
}
