//! The role names of [`Role`] as operators type them and the gateway stores them.

use crate::proto::Role;

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
    }
}
