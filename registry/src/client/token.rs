//! Answering a registry's 401: the challenge's scheme decides. Bearer (the
//! distribution specification's token flow): a token is asked of the
//! challenge's realm for the request's scope, anonymously, with Basic
//! credentials, or by exchanging an identity (refresh) token, and cached
//! for its lifetime. Basic: the credentials themselves. The realm is
//! untrusted (it comes from the registry): it must be HTTPS (or plain HTTP
//! to a host the caller allowed it), never this machine, a link-local or a
//! multicast address unless the registry is that host, and its answer is
//! bounded (`auth::MAX_TOKEN_REPLY`); no redirect is followed.

use super::transport::host_of;
use super::{Client, Target};
use crate::auth::{self, Challenge, Credentials};
use crate::error::{Error, ErrorKind};
use crate::reference::excerpt;
use std::io::Read;
use ureq::http::header;

/// The `client_id` sent with an identity-token exchange.
const CLIENT_ID: &str = "imager";

impl Client {
    /// Obtains (and caches for `scope`) what answers the `challenges` of a
    /// 401 from the target's registry.
    pub(super) fn authenticate(
        &self,
        target: &Target,
        scope: &str,
        challenges: &[String],
    ) -> Result<(), Error> {
        let registry = target.reference.registry();
        let credentials = self.credentials(registry);
        if challenges.is_empty() {
            return Err(Error::new(
                ErrorKind::Unauthorized,
                format!(
                    "{registry} answered HTTP 401 to {} {} without saying how to authenticate \
                     (no WWW-Authenticate header)",
                    target.verb(),
                    target.reference.name()
                ),
            ));
        }
        let mut parsed = Vec::new();
        for h in challenges {
            parsed.extend(auth::parse_challenges(h)?);
        }
        if let Some(c) = parsed.iter().find(|c| c.scheme == "bearer") {
            return self.bearer(target, scope, c, &credentials);
        }
        if parsed.iter().any(|c| c.scheme == "basic") {
            let Some(value) = credentials.basic_header() else {
                return Err(Error::new(
                    ErrorKind::Unauthorized,
                    format!(
                        "{registry} requires a user name and password to {} {} (HTTP 401, \
                         Basic): give credentials for {registry} (docs/registry.md, \
                         \"Authentication\")",
                        target.verb(),
                        target.reference.name()
                    ),
                ));
            };
            self.tokens().put(registry, scope, value, None);
            return Ok(());
        }
        let schemes: Vec<&str> = parsed.iter().map(|c| c.scheme.as_str()).collect();
        Err(Error::new(
            ErrorKind::Unauthorized,
            format!(
                "{registry} asks for authentication by {}, which this client does not speak \
                 (it speaks Bearer and Basic)",
                excerpt(&schemes.join(", "))
            ),
        ))
    }

    /// The token flow: a token for `scope` from the challenge's realm.
    fn bearer(
        &self,
        target: &Target,
        scope: &str,
        challenge: &Challenge,
        credentials: &Credentials,
    ) -> Result<(), Error> {
        let reference = target.reference;
        let registry = reference.registry();
        let bad_realm = |why: &str| {
            Error::new(
                ErrorKind::Http,
                format!(
                    "{registry} sends its clients for a token to {}: {why}",
                    excerpt(challenge.param("realm").unwrap_or_default())
                ),
            )
        };
        let realm = challenge
            .param("realm")
            .filter(|r| !r.is_empty())
            .ok_or_else(|| bad_realm("no realm in its Bearer challenge: refused"))?;
        let host = host_of(realm);
        let (scheme, _) = realm
            .split_once("://")
            .ok_or_else(|| bad_realm("not an absolute URL: refused"))?;
        match scheme {
            "https" => {}
            "http" if self.scheme(host) == "http" => {}
            "http" => {
                return Err(bad_realm(
                    "plain HTTP to a host not allowed plain HTTP: refused (credentials and \
                     tokens travel over HTTPS only)",
                ));
            }
            _ => return Err(bad_realm("not an HTTP(S) URL: refused")),
        }
        if host.is_empty() {
            return Err(bad_realm("a URL without a host: refused"));
        }
        if let Some(why) = self.forbidden_target(host, reference) {
            return Err(bad_realm(why));
        }
        let service = challenge.param("service");
        let mut query: Vec<(&str, &str)> = Vec::new();
        if let Some(s) = service {
            query.push(("service", s));
        }
        query.push(("scope", scope));
        let answer = match credentials {
            Credentials::IdentityToken(refresh) => {
                let mut form = vec![
                    ("grant_type", "refresh_token"),
                    ("client_id", CLIENT_ID),
                    ("refresh_token", refresh.as_str()),
                ];
                form.extend(query.iter().copied());
                self.agent.post(realm).send_form(form)
            }
            Credentials::Basic { .. } => {
                let basic = credentials.basic_header().unwrap_or_default();
                self.agent
                    .get(realm)
                    .query_pairs(query.iter().copied())
                    .header(header::AUTHORIZATION, basic)
                    .call()
            }
            Credentials::Anonymous => self
                .agent
                .get(realm)
                .query_pairs(query.iter().copied())
                .call(),
        };
        let service_name = format!("{} of {registry}", excerpt(host));
        let response = answer.map_err(|e| {
            Error::new(
                ErrorKind::Unreachable,
                format!(
                    "cannot get a token from the token service {service_name} ({}): check that \
                     it is up",
                    super::transport::describe(&e)
                ),
            )
        })?;
        let status = response.status().as_u16();
        match status {
            200 => {}
            401 | 403 if credentials.is_anonymous() => {
                return Err(Error::new(
                    ErrorKind::Unauthorized,
                    format!(
                        "{registry} requires credentials to {} {}: its token service {service_name} \
                         gives no anonymous token for it (HTTP {status}): give credentials for \
                         {registry} (docs/registry.md, \"Authentication\")",
                        target.verb(),
                        reference.name()
                    ),
                ));
            }
            401 | 403 => {
                return Err(Error::new(
                    ErrorKind::Unauthorized,
                    format!(
                        "the token service {service_name} refused the credentials given for \
                         {registry} to {} {} (HTTP {status}): check the user name and the \
                         password or token, and that they may {}",
                        target.verb(),
                        reference.name(),
                        if target.push { "push there" } else { "pull it" }
                    ),
                ));
            }
            _ => {
                return Err(Error::new(
                    ErrorKind::Http,
                    format!("the token service {service_name} answered HTTP {status}"),
                ));
            }
        }
        let mut bytes = Vec::new();
        response
            .into_body()
            .into_reader()
            .take(auth::MAX_TOKEN_REPLY + 1)
            .read_to_end(&mut bytes)
            .map_err(|e| {
                Error::new(
                    ErrorKind::Truncated,
                    format!("reading the reply of the token service {service_name}: {e}"),
                )
            })?;
        let reply = auth::parse_token_reply(&bytes, &service_name)?;
        self.tokens().put(
            registry,
            scope,
            format!("Bearer {}", reply.token),
            Some(reply.lifetime),
        );
        Ok(())
    }
}
