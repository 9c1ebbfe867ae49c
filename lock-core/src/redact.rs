//! Hiding secrets in backend URLs before they reach a message, a log line
//! or a `Debug` output.

/// `url` with every secret replaced by `***`: the password of
/// `user:password@`, a bare `secret@` userinfo (some drivers read it as a
/// password, so it is hidden whole), and the value of every query option
/// whose name contains `pass`, `secret`, `pwd` or `auth`
/// (`password=`, `sentinel_password=`, ...). Everything else is kept, so
/// the result still says which server was meant.
pub fn redact_url(url: &str) -> String {
    let (head, query) = match url.split_once('?') {
        Some((head, query)) => (head, Some(query)),
        None => (url, None),
    };
    let mut out = match head.split_once("://") {
        Some((scheme, rest)) => {
            let authority_end = rest.find('/').unwrap_or(rest.len());
            let (authority, path) = rest.split_at(authority_end);
            match authority.rsplit_once('@') {
                Some((userinfo, hosts)) => match userinfo.split_once(':') {
                    Some((user, _)) => format!("{scheme}://{user}:***@{hosts}{path}"),
                    None => format!("{scheme}://***@{hosts}{path}"),
                },
                None => head.to_owned(),
            }
        }
        None => head.to_owned(),
    };
    if let Some(query) = query {
        out.push('?');
        let options: Vec<String> = query
            .split('&')
            .map(|option| match option.split_once('=') {
                Some((name, _)) if is_secret(name) => format!("{name}=***"),
                _ => option.to_owned(),
            })
            .collect();
        out.push_str(&options.join("&"));
    }
    out
}

fn is_secret(option: &str) -> bool {
    let name = option.to_ascii_lowercase();
    ["pass", "secret", "pwd", "auth"]
        .iter()
        .any(|word| name.contains(word))
}

#[cfg(test)]
mod tests {
    use super::redact_url;

    #[test]
    fn passwords_are_hidden_wherever_they_are() {
        for (url, want) in [
            (
                "redis://user:s3cret@host:6379/0?x=1",
                "redis://user:***@host:6379/0?x=1",
            ),
            ("redis://:s3cret@host", "redis://:***@host"),
            ("redis://s3cret@host", "redis://***@host"),
            (
                "redis+sentinel://h1,h2/m?password=s3cret&sentinel_password=s3cret&db=1",
                "redis+sentinel://h1,h2/m?password=***&sentinel_password=***&db=1",
            ),
            (
                "postgres://u@h/db?PassWord=s3cret",
                "postgres://***@h/db?PassWord=***",
            ),
            ("sqlite:///tmp/a.db", "sqlite:///tmp/a.db"),
            ("sqlite::memory:", "sqlite::memory:"),
            ("etcd://h:2379/p?ca=/x.pem", "etcd://h:2379/p?ca=/x.pem"),
        ] {
            assert_eq!(redact_url(url), want, "{url}");
            assert!(!redact_url(url).contains("s3cret"), "{url}");
        }
    }
}
