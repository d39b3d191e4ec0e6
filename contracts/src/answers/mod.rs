//! The JSON answers of the routes the CLI reads, one module per service: the services answer
//! with these types and the CLI reads them, so the two cannot drift apart. Each derives its
//! OpenAPI schema with the `utoipa` feature and, where stored as it is, `sqlx::Type` with
//! `sqlx`.

/// Declares a status enum spelled in `snake_case` in JSON and, stored as text, in SQL, with
/// `as_str` giving that spelling: `/// doc SchemaName Name { Variant => "variant", ... }`.
macro_rules! status {
    ($(#[$doc:meta])* $schema:ident $name:ident {
        $($(#[$vdoc:meta])* $variant:ident => $text:literal),* $(,)?
    }) => {
        $(#[$doc])*
        #[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
        #[cfg_attr(feature = "utoipa", derive(utoipa::ToSchema), schema(as = $schema))]
        #[cfg_attr(
            feature = "sqlx",
            derive(sqlx::Type),
            sqlx(type_name = "text", rename_all = "snake_case")
        )]
        #[serde(rename_all = "snake_case")]
        pub enum $name { $($(#[$vdoc])* $variant),* }

        impl $name {
            /// The name as stored and answered.
            pub fn as_str(self) -> &'static str {
                match self { $(Self::$variant => $text),* }
            }
        }
    };
}

pub mod billing;
pub mod domain;
pub mod gateway;
pub mod sender;
