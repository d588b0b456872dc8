//! Roles and what they may call.
//!
//! A client certificate names its role in its subject's organization
//! (`O=imager:reader`, `imager:operator`, `imager:admin`), one organization
//! only; the cluster CA's signature is what makes it true (the server
//! checks the chain first, [`crate::tls`]).
//!
//! | operation | reader | operator | admin |
//! |---|---|---|---|
//! | status | yes | yes | yes |
//! | upgrade, stage, arm, cancel, rollback, reboot | no | yes | yes |
//! | an upgrade that wipes EPHEMERAL (`--preserve=false`), an upgrade or rollback below the security floor (`--allow-downgrade`), power-off, replacing the node's credentials | no | no | yes |

use anyhow::{Result, bail};

/// What a client may do.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Role {
    Reader,
    Operator,
    Admin,
}

/// The prefix of the organization that names a role.
pub const ORGANIZATION_PREFIX: &str = "imager:";

impl Role {
    pub const ALL: [Role; 3] = [Role::Reader, Role::Operator, Role::Admin];

    pub fn name(self) -> &'static str {
        match self {
            Role::Reader => "reader",
            Role::Operator => "operator",
            Role::Admin => "admin",
        }
    }

    pub fn parse(name: &str) -> Option<Role> {
        Role::ALL.into_iter().find(|r| r.name() == name)
    }

    /// The organization a certificate of this role carries.
    pub fn organization(self) -> String {
        format!("{ORGANIZATION_PREFIX}{}", self.name())
    }

    /// The role named by a certificate's organizations: exactly one must
    /// be a role.
    pub fn from_organizations<'a>(orgs: impl IntoIterator<Item = &'a str>) -> Result<Role> {
        let mut found = None;
        for o in orgs {
            let Some(name) = o.strip_prefix(ORGANIZATION_PREFIX) else {
                continue;
            };
            let Some(role) = Role::parse(name) else {
                bail!(
                    "the client certificate names an unknown role {}",
                    contract::text::excerpt(name)
                );
            };
            if found.replace(role).is_some() {
                bail!("the client certificate names more than one role");
            }
        }
        found.ok_or_else(|| {
            anyhow::anyhow!(
                "the client certificate names no role (its subject needs O={}reader, \
                 operator or admin: make it with `imager node credentials`)",
                ORGANIZATION_PREFIX
            )
        })
    }

    /// Whether this role may call `op`.
    pub fn may(self, op: Op) -> bool {
        let needs = match op {
            Op::Status => Role::Reader,
            Op::Upgrade {
                wipe: false,
                downgrade: false,
            }
            | Op::Arm
            | Op::Cancel
            | Op::Rollback { downgrade: false }
            | Op::Reboot => Role::Operator,
            Op::Upgrade { .. } | Op::Rollback { .. } | Op::PowerOff | Op::Credentials => {
                Role::Admin
            }
        };
        self >= needs
    }
}

/// The operations of the API, as far as roles go.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Op {
    Status,
    /// An upgrade (staged or not); `wipe`: EPHEMERAL is wiped at the next
    /// boot (`--preserve=false`); `downgrade`: a lower security version is
    /// allowed (`--allow-downgrade`).
    Upgrade {
        wipe: bool,
        downgrade: bool,
    },
    /// Arms a staged upgrade.
    Arm,
    /// Cancels the upgrade in progress while it pulls.
    Cancel,
    Rollback {
        downgrade: bool,
    },
    Reboot,
    PowerOff,
    /// Replaces the node's own credentials (its CA certificates, its
    /// certificate and key).
    Credentials,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn roles_round_trip_and_order_what_they_may_call() {
        for r in Role::ALL {
            assert_eq!(Role::parse(r.name()), Some(r));
            let org = r.organization();
            assert_eq!(Role::from_organizations([org.as_str()]).ok(), Some(r));
        }
        let table = [
            (Op::Status, [true, true, true]),
            (
                Op::Upgrade {
                    wipe: false,
                    downgrade: false,
                },
                [false, true, true],
            ),
            (Op::Arm, [false, true, true]),
            (Op::Cancel, [false, true, true]),
            (Op::Rollback { downgrade: false }, [false, true, true]),
            (Op::Reboot, [false, true, true]),
            (
                Op::Upgrade {
                    wipe: true,
                    downgrade: false,
                },
                [false, false, true],
            ),
            (
                Op::Upgrade {
                    wipe: false,
                    downgrade: true,
                },
                [false, false, true],
            ),
            (Op::Rollback { downgrade: true }, [false, false, true]),
            (Op::PowerOff, [false, false, true]),
            (Op::Credentials, [false, false, true]),
        ];
        for (op, allowed) in table {
            for (r, want) in Role::ALL.into_iter().zip(allowed) {
                assert_eq!(r.may(op), want, "{r:?} {op:?}");
            }
        }
    }

    #[test]
    fn a_certificate_names_exactly_one_known_role() {
        assert!(Role::from_organizations(["Example Corp"]).is_err());
        assert!(Role::from_organizations(["imager:root"]).is_err());
        assert!(Role::from_organizations(["imager:admin", "imager:reader"]).is_err());
        assert_eq!(
            Role::from_organizations(["Example Corp", "imager:reader"]).ok(),
            Some(Role::Reader)
        );
    }
}
