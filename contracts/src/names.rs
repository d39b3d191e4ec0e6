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

/// A role stored as its name (`text`): encoded with [`Role::name`], decoded with
/// [`Role::parse`], so an unknown name is an error rather than a caller without a role.
#[cfg(feature = "sqlx")]
mod stored {
    use sqlx::encode::IsNull;
    use sqlx::error::BoxDynError;
    use sqlx::postgres::{PgArgumentBuffer, PgTypeInfo, PgValueRef};
    use sqlx::{Decode, Encode, Postgres, Type};

    use crate::proto::Role;

    impl Type<Postgres> for Role {
        fn type_info() -> PgTypeInfo {
            <&str as Type<Postgres>>::type_info()
        }

        fn compatible(ty: &PgTypeInfo) -> bool {
            <&str as Type<Postgres>>::compatible(ty)
        }
    }

    impl Encode<'_, Postgres> for Role {
        fn encode_by_ref(&self, buf: &mut PgArgumentBuffer) -> Result<IsNull, BoxDynError> {
            <&str as Encode<Postgres>>::encode(self.name(), buf)
        }
    }

    impl<'r> Decode<'r, Postgres> for Role {
        fn decode(value: PgValueRef<'r>) -> Result<Self, BoxDynError> {
            let name = <&str as Decode<Postgres>>::decode(value)?;
            Role::parse(name).ok_or_else(|| format!("no role named {name:?}").into())
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
