//! The names of the proto enums as people type them and the services store them.

use crate::proto::{JobKind, Role};

impl Role {
    /// The role named `name` (`member` or `admin`).
    pub fn parse(name: &str) -> Option<Self> {
        match name {
            "member" => Some(Role::Member),
            "admin" => Some(Role::Admin),
            _ => None,
        }
    }

    /// The role's name (`member`, `admin`); `unspecified` for a caller without one.
    pub fn name(self) -> &'static str {
        match self {
            Role::Member => "member",
            Role::Admin => "admin",
            Role::Unspecified => "unspecified",
        }
    }
}

impl JobKind {
    /// The kind's stored name (`verification`, `transactional`, `lifecycle`, `marketing`).
    pub fn name(self) -> &'static str {
        match self {
            JobKind::Unspecified => "unspecified",
            JobKind::Verification => "verification",
            JobKind::Transactional => "transactional",
            JobKind::Lifecycle => "lifecycle",
            JobKind::Marketing => "marketing",
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_round_trip() {
        for role in [Role::Member, Role::Admin] {
            assert_eq!(Role::parse(role.name()), Some(role));
        }
        assert_eq!(Role::parse("owner"), None);
        assert_eq!(Role::parse("unspecified"), None);
        assert_eq!(JobKind::Marketing.name(), "marketing");
    }
}
