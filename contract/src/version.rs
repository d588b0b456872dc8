//! The version an operator asks for. A registry can serve any signed
//! payload under any tag: an older one, genuinely signed, under a newer tag
//! installed itself (issue 25). So `imager node upgrade` sends the version
//! it expects (`--version`, else the version its image reference's tag
//! names), and the node refuses a signed payload of another version before
//! it writes anything. Versions are compared as the strings the signed
//! manifest and the profile carry: the same string, or refused.

/// The longest version, in bytes.
pub const MAX_VERSION: usize = 64;

/// The one rule for a version string, wherever one comes from (a profile,
/// a signed manifest, a request): it names the image in os-release
/// (`VERSION_ID=`, unquoted), boot entries, META's slot records
/// (`status=good version=…`, split at spaces), the upgrade history and
/// image tags. 1 to [`MAX_VERSION`] ASCII letters, digits, `.`, `_`, `-`
/// and `+`, starting with a letter or digit.
pub fn check(v: &str) -> Result<(), String> {
    let ok = !v.is_empty()
        && v.len() <= MAX_VERSION
        && v.starts_with(|c: char| c.is_ascii_alphanumeric())
        && v.chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-' | '+'));
    if ok {
        Ok(())
    } else {
        Err(format!(
            "{}: use 1 to {MAX_VERSION} letters, digits, '.', '_', '-' and '+', starting with a \
             letter or digit (it goes into os-release, boot entries, META and image tags)",
            crate::text::excerpt(v)
        ))
    }
}

/// Whether a payload of security version `security` may go onto (or be
/// rolled back to on) a disk whose highest blessed security version is
/// `floor`: not lower, unless an admin allows this one downgrade. Security
/// versions are whole numbers a profile sets (`security_version`), signed
/// in the manifest, recorded per slot in META and raised on the disk only
/// when a slot is blessed (docs/signing.md, "Security versions").
pub fn check_security(floor: u64, security: u64, allow_downgrade: bool) -> Result<(), String> {
    if security < floor && !allow_downgrade {
        return Err(format!(
            "its security version {security} is lower than {floor}, the highest this disk has \
             blessed: it may carry the flaws a later version fixed; an admin may allow this \
             one downgrade with --allow-downgrade"
        ));
    }
    Ok(())
}

/// The version a tag names: the tag, without a leading `v` (`v1.7.0` names
/// `1.7.0`), when what is left starts with a digit; none for a tag that
/// names no version (`latest`, `stable`, `foreign`), which then needs
/// `--version` to be checked.
pub fn named_by_tag(tag: &str) -> Option<&str> {
    let v = tag.strip_prefix('v').unwrap_or(tag);
    v.starts_with(|c: char| c.is_ascii_digit()).then_some(v)
}

/// Whether a payload of version `actual` is what was asked for.
pub fn is_expected(expected: Option<&str>, actual: &str) -> bool {
    expected.is_none_or(|e| e == actual)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_rule_for_versions() {
        for good in ["0.1.0", "1", "2024.11.27-rc1+build.5", "v1_2"] {
            assert_eq!(check(good), Ok(()), "{good}");
        }
        let long = "1".repeat(MAX_VERSION + 1);
        for bad in [
            "",
            " 1",
            "1 2",
            "1\n2",
            "-1",
            ".1",
            "1/2",
            "é",
            long.as_str(),
        ] {
            let e = check(bad).unwrap_err();
            assert!(!e.chars().any(char::is_control), "{e}");
        }
    }

    #[test]
    fn a_lower_security_version_needs_an_admin() {
        assert_eq!(check_security(0, 0, false), Ok(()));
        assert_eq!(check_security(2, 2, false), Ok(()));
        assert_eq!(check_security(2, 3, false), Ok(()));
        let e = check_security(2, 1, false).unwrap_err();
        assert!(
            e.contains("security version 1 is lower than 2") && e.contains("--allow-downgrade"),
            "{e}"
        );
        assert_eq!(check_security(2, 1, true), Ok(()));
    }

    #[test]
    fn tags_name_versions_with_or_without_a_v() {
        assert_eq!(named_by_tag("0.3.0"), Some("0.3.0"));
        assert_eq!(named_by_tag("v1.7.0"), Some("1.7.0"));
        assert_eq!(named_by_tag("2"), Some("2"));
        for none in ["latest", "stable", "foreign", "v", "", "version-1"] {
            assert_eq!(named_by_tag(none), None, "{none}");
        }
    }

    #[test]
    fn only_the_same_version_is_expected() {
        assert!(is_expected(Some("0.3.0"), "0.3.0"));
        assert!(!is_expected(Some("0.3.0"), "0.1.0"));
        assert!(!is_expected(Some("0.3.0"), "0.3.0.1"));
        assert!(is_expected(None, "0.1.0"));
    }
}
