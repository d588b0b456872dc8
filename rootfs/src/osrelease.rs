//! os-release(5): `KEY=value` lines, values optionally quoted shell-style.

/// The value of `key`, unquoted; the last assignment wins.
pub fn get(text: &str, key: &str) -> Option<String> {
    text.lines()
        .filter_map(|line| {
            let line = line.trim();
            if line.starts_with('#') {
                return None;
            }
            let (k, v) = line.split_once('=')?;
            (k.trim() == key).then(|| unquote(v.trim()))
        })
        .next_back()
}

/// Removes one level of double or single quotes and backslash escapes
/// inside double quotes, as os-release(5) allows.
fn unquote(v: &str) -> String {
    if let Some(inner) = v.strip_prefix('\'').and_then(|s| s.strip_suffix('\'')) {
        return inner.to_string();
    }
    let Some(inner) = v.strip_prefix('"').and_then(|s| s.strip_suffix('"')) else {
        return v.to_string();
    };
    let mut out = String::with_capacity(inner.len());
    let mut chars = inner.chars();
    while let Some(c) = chars.next() {
        if c == '\\' {
            if let Some(n) = chars.next() {
                out.push(n);
            }
        } else {
            out.push(c);
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_os_release() {
        let t = "NAME=\"Imager OS\"\nID=imager\n# VERSION_ID=0\nVERSION_ID=1.2.0\nPRETTY_NAME='A \"b\"'\nX=\"a\\\"b\"\n";
        assert_eq!(get(t, "VERSION_ID").as_deref(), Some("1.2.0"));
        assert_eq!(get(t, "NAME").as_deref(), Some("Imager OS"));
        assert_eq!(get(t, "PRETTY_NAME").as_deref(), Some("A \"b\""));
        assert_eq!(get(t, "X").as_deref(), Some("a\"b"));
        assert_eq!(get(t, "MISSING"), None);
        assert_eq!(
            get("VERSION_ID=1\nVERSION_ID=2\n", "VERSION_ID").as_deref(),
            Some("2")
        );
    }
}
