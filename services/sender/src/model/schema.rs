//! Pieces of the JSON Schemas that document what request bodies must hold. Each mirrors a
//! check the code makes, no stricter, so that values made from the API's document are ones
//! the routes accept. Patterns are ECMA-262, anchored and counted in code points; character
//! classes are spelled out, as `\s` is not what `str::trim` removes.

use utoipa::openapi::schema::{
    AdditionalProperties, AnyOfBuilder, ObjectBuilder, SchemaFormat, SchemaType, Type,
};
use utoipa::openapi::KnownFormat;

/// What `str::trim` removes (`char::is_whitespace`: Unicode White_Space), in a class.
pub(crate) const WHITE_SPACE: &str =
    r"\t-\r \x85\xa0\u1680\u2000-\u200a\u2028\u2029\u202f\u205f\u3000";
/// The white space that is not a control character, in a class.
pub(crate) const SPACE: &str = r" \xa0\u1680\u2000-\u200a\u2028\u2029\u202f\u205f\u3000";
/// What `char::is_control` finds (Unicode Cc), in a class.
pub(crate) const CONTROL: &str = r"\x00-\x1f\x7f-\x9f";

/// A string matching `pattern`.
pub(crate) fn string(pattern: impl Into<String>) -> ObjectBuilder {
    ObjectBuilder::new()
        .schema_type(Type::String)
        .pattern(Some(pattern))
}

/// `string`, a string schema, taking null too (an `Option` field, where null counts as absent).
pub(crate) fn or_null(string: ObjectBuilder) -> ObjectBuilder {
    string.schema_type(SchemaType::from_iter([Type::String, Type::Null]))
}

/// Any value but a string not matching `pattern` (a field the code reads only when it is a
/// string).
pub(crate) fn unless_string(pattern: impl Into<String>) -> ObjectBuilder {
    ObjectBuilder::new()
        .schema_type(SchemaType::AnyValue)
        .pattern(Some(pattern))
}

/// Any value but null.
pub(crate) fn not_null() -> ObjectBuilder {
    ObjectBuilder::new().schema_type(SchemaType::from_iter([
        Type::String,
        Type::Number,
        Type::Boolean,
        Type::Object,
        Type::Array,
    ]))
}

/// A string that is one of `values`.
pub(crate) fn one_of_strings(values: &[&str]) -> ObjectBuilder {
    ObjectBuilder::new()
        .schema_type(Type::String)
        .enum_values(Some(values.iter().copied()))
}

/// An object with no other fields than those it names.
pub(crate) fn closed() -> ObjectBuilder {
    ObjectBuilder::new().additional_properties(Some(AdditionalProperties::FreeForm(false)))
}

/// Text that is not blank: something is left once it is trimmed.
pub(crate) fn not_blank() -> ObjectBuilder {
    string(format!("[^{WHITE_SPACE}]"))
}

/// Text on one line: no control character.
pub(crate) fn one_line() -> ObjectBuilder {
    string(format!("^[^{CONTROL}]*$"))
}

/// Text on one line that is not blank.
pub(crate) fn not_blank_line() -> ObjectBuilder {
    string(format!("^[^{CONTROL}]*[^{CONTROL}{SPACE}][^{CONTROL}]*$"))
}

/// A key: 1-`max` letters, digits, `_`, `-` or `.` once trimmed (`model::parse_key`).
pub(crate) fn key(max: usize) -> ObjectBuilder {
    string(format!(
        "^[{WHITE_SPACE}]*[A-Za-z0-9_.-]{{1,{max}}}[{WHITE_SPACE}]*$"
    ))
    .description(Some(format!("1-{max} letters, digits, `_`, `-` or `.`")))
}

/// An email address (`EmailAddress::parse`; it also takes one with white space around it).
pub(crate) fn email() -> ObjectBuilder {
    ObjectBuilder::new()
        .schema_type(Type::String)
        .format(Some(SchemaFormat::KnownFormat(KnownFormat::Email)))
}

/// An email address, or blank text, which names none.
pub(crate) fn email_or_blank() -> AnyOfBuilder {
    AnyOfBuilder::new()
        .item(email())
        .item(string(format!("^[{WHITE_SPACE}]*$")))
}

/// A comma-separated list of email addresses, blank entries skipped (`EmailAddress::parse`
/// on each, which also takes addresses `format: email` does not: a local part is any text
/// with no white space, control or `@.<>()[],;:\"` between its dots; it holds at most 64
/// bytes, here at most 64 characters besides its dots, and the 254-byte limit of the
/// address is left out).
pub(crate) fn email_list() -> ObjectBuilder {
    let atom = format!(r#"[^{WHITE_SPACE}{CONTROL}@.<>()\[\],;:\\"]"#);
    let label = "[A-Za-z0-9](?:[A-Za-z0-9-]{0,61}[A-Za-z0-9])?";
    let entry = format!(
        r"[{WHITE_SPACE}]*(?:{atom}(?:\.?{atom}){{0,63}}@{label}(?:\.{label})+[{WHITE_SPACE}]*)?"
    );
    string(format!("^{entry}(?:,{entry})*$"))
}

/// A uuid (`Uuid::parse_str`; it also takes the simple, braced and URN spellings).
pub(crate) fn uuid() -> ObjectBuilder {
    ObjectBuilder::new()
        .schema_type(Type::String)
        .format(Some(SchemaFormat::KnownFormat(KnownFormat::Uuid)))
}

/// `EmailType::parse`: `transactional`, `lifecycle`, `marketing` or blank (the default),
/// once trimmed.
pub(crate) fn email_type() -> String {
    format!("^[{WHITE_SPACE}]*(?:transactional|lifecycle|marketing)?[{WHITE_SPACE}]*$")
}

/// `impl ToSchema` for a type whose schema is written by hand (its `PartialSchema`): the
/// component's name, and the components that schema refers to (each with its own).
macro_rules! component {
    ($ty:ty as $name:literal $(refers $($dep:ty),+)?) => {
        impl utoipa::ToSchema for $ty {
            fn name() -> std::borrow::Cow<'static, str> {
                std::borrow::Cow::Borrowed($name)
            }

            fn schemas(
                schemas: &mut Vec<(String, utoipa::openapi::RefOr<utoipa::openapi::schema::Schema>)>,
            ) {
                let _ = &schemas;
                $($(
                    schemas.push((
                        <$dep as utoipa::ToSchema>::name().into_owned(),
                        <$dep as utoipa::PartialSchema>::schema(),
                    ));
                    <$dep as utoipa::ToSchema>::schemas(schemas);
                )+)?
            }
        }
    };
}
pub(crate) use component;
