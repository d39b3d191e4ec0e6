//! The API reference in Markdown (`docs/api.md`), written from the OpenAPI document: each
//! service's operations with who may call them, their parameters, request and answer
//! bodies and errors, then every body schema with its fields. `make openapi` rewrites the
//! file; a test fails when it is not current.

use std::fmt::Write as _;
use std::sync::OnceLock;

use axum::response::Html;
use maud::{html, PreEscaped, DOCTYPE};
use pulldown_cmark::{CowStr, Event, Options, Parser, Tag, TagEnd};
use serde_json::Value;

use postmesh_contracts::routes::gateway as api;
use postmesh_shared::Routes;

use crate::openapi::{document, owner_name, who};
use crate::table::table;
use crate::web::head;
use crate::AppState;

/// The gateway's route that serves the reference as a page.
pub fn routes() -> Routes<AppState> {
    Routes::new().at(api::DOCS, docs)
}

/// `GET /docs`, rendered once.
async fn docs() -> Html<&'static str> {
    static PAGE: OnceLock<String> = OnceLock::new();
    Html(PAGE.get_or_init(page).as_str())
}

/// The readable reference: every operation with who may call it, its parameters, bodies
/// and answers, and every body schema (the reference of `docs/api.md`, as HTML).
fn page() -> String {
    html! {
        (DOCTYPE)
        html lang="en" {
            (head("Postmesh API reference", STYLE))
            body {
                p {
                    "The machine-readable document is "
                    a href="/openapi.json" { "/openapi.json" }
                    " (OpenAPI 3.1)."
                }
                (PreEscaped(to_html(&markdown())))
            }
        }
    }
    .into_string()
}

/// The reference page's look: readable width; on a narrow screen, tables scroll inside
/// themselves and long paths wrap.
const STYLE: &str = "body{font-family:system-ui,sans-serif;max-width:60rem;margin:2rem auto;\
    padding:0 1rem;line-height:1.5;overflow-wrap:break-word}table{border-collapse:collapse;\
    margin:.5rem 0;display:block;max-width:100%;overflow-x:auto}th,td{border:1px solid #ccc;\
    padding:.2rem .5rem;text-align:left;vertical-align:top}code{background:#f4f4f4;\
    padding:0 .2rem}h3{margin-top:2rem}";

/// Where the reference is kept, from the repository's root.
pub const PATH: &str = "docs/api.md";

/// How deep a schema's type is spelled out before it is just `object`.
const MAX_DEPTH: usize = 4;

/// The reference of the whole API.
pub fn markdown() -> String {
    let doc = document();
    let schemas = &doc["components"]["schemas"];
    let entries = table();
    let mut owners: Vec<String> = entries.iter().map(|e| owner_name(e.target)).collect();
    owners.dedup();
    let mut out = String::from(
        "# Postmesh API reference\n\n\
         Written from the OpenAPI document the gateway serves at `GET /openapi.json` (by \
         `make openapi`; a test fails when this file is not current). Every error body is \
         `{\"success\": false, \"error\": \"...\"}` with the status code named below, except \
         where an operation says otherwise. `GET /docs` shows the same reference in a \
         browser.\n\n## Services\n\n",
    );
    for owner in &owners {
        let count = entries
            .iter()
            .filter(|e| &owner_name(e.target) == owner)
            .count();
        let _ = writeln!(out, "- [{owner}](#{owner}): {count} operations");
    }
    for owner in &owners {
        let _ = write!(out, "\n## {owner}\n");
        for entry in entries.iter().filter(|e| &owner_name(e.target) == owner) {
            let (method, path) = (entry.spec.method.as_str(), entry.spec.path);
            let operation = &doc["paths"][path][method.to_lowercase()];
            let _ = write!(out, "\n### `{method} {path}`\n\n");
            let _ = writeln!(out, "Who may call: {}.", who(entry.spec.policy));
            operation_body(&mut out, operation);
        }
    }
    out.push_str("\n## Schemas\n");
    if let Some(all) = schemas.as_object() {
        for (name, schema) in all {
            let _ = write!(out, "\n### {name}\n\n");
            schema_body(&mut out, schema);
        }
    }
    out
}

/// The reference as HTML (the body of `GET /docs`): its headings carry the ids its links
/// point at, as a Markdown viewer makes them.
pub fn to_html(markdown: &str) -> String {
    let mut events: Vec<Event> = Parser::new_ext(markdown, Options::ENABLE_TABLES).collect();
    let mut at = 0;
    while at < events.len() {
        if matches!(events[at], Event::Start(Tag::Heading { .. })) {
            let mut text = String::new();
            for e in events[at + 1..]
                .iter()
                .take_while(|e| !matches!(e, Event::End(TagEnd::Heading(_))))
            {
                if let Event::Text(t) | Event::Code(t) = e {
                    text.push_str(t);
                }
            }
            if let Event::Start(Tag::Heading { id, .. }) = &mut events[at] {
                *id = Some(CowStr::from(slug(&text)));
            }
        }
        at += 1;
    }
    let mut out = String::with_capacity(markdown.len() * 2);
    pulldown_cmark::html::push_html(&mut out, events.into_iter());
    out
}

/// A heading's anchor as Markdown viewers make it: lower case, letters, digits, `-` and
/// `_` kept, spaces as `-`, the rest dropped.
fn slug(text: &str) -> String {
    text.to_lowercase()
        .chars()
        .filter_map(|c| match c {
            ' ' => Some('-'),
            c if c.is_alphanumeric() || c == '-' || c == '_' => Some(c),
            _ => None,
        })
        .collect()
}

/// An operation's parameters, bodies and answers.
fn operation_body(out: &mut String, operation: &Value) {
    if let Some(parameters) = operation["parameters"].as_array() {
        out.push_str("\n| parameter | in | type | required |\n|---|---|---|---|\n");
        for p in parameters {
            let _ = writeln!(
                out,
                "| `{}` | {} | {} | {} |",
                p["name"].as_str().unwrap_or_default(),
                p["in"].as_str().unwrap_or_default(),
                type_of(&p["schema"], 0),
                yes_no(p["required"].as_bool().unwrap_or(false)),
            );
        }
    }
    let request = &operation["requestBody"];
    if !request.is_null() {
        let _ = writeln!(
            out,
            "\nRequest body ({}): {}.",
            match request["required"].as_bool() {
                Some(false) => "optional",
                _ => "required",
            },
            content_type(&request["content"]),
        );
    }
    if let Some(responses) = operation["responses"].as_object() {
        out.push_str("\n| answer | meaning | body |\n|---|---|---|\n");
        for (status, response) in responses {
            let _ = writeln!(
                out,
                "| {status} | {} | {} |",
                cell(response["description"].as_str().unwrap_or_default()),
                content_type(&response["content"]),
            );
        }
    }
}

/// A schema's fields (an object), or its type.
fn schema_body(out: &mut String, schema: &Value) {
    if let Some(text) = schema["description"].as_str() {
        let _ = writeln!(out, "{}\n", text.trim());
    }
    if let Some(parts) = schema["allOf"].as_array() {
        // A wrapped answer: the fields of each named part, and those of the inline ones.
        for part in parts {
            if part["$ref"].is_string() {
                let _ = writeln!(out, "Every field of {}, and:\n", type_of(part, 0));
            }
        }
        for part in parts.iter().filter(|p| !p["$ref"].is_string()) {
            schema_body(out, part);
        }
        return;
    }
    let Some(properties) = schema["properties"].as_object() else {
        let _ = writeln!(out, "Type: {}.", type_of(schema, 0));
        return;
    };
    let required: Vec<&str> = schema["required"]
        .as_array()
        .map(|r| r.iter().filter_map(Value::as_str).collect())
        .unwrap_or_default();
    out.push_str("| field | type | required | description |\n|---|---|---|---|\n");
    for (name, field) in properties {
        let _ = writeln!(
            out,
            "| `{name}` | {} | {} | {} |",
            type_of(field, 0),
            yes_no(required.contains(&name.as_str())),
            cell(field["description"].as_str().unwrap_or_default()),
        );
    }
}

/// The body a `content` map describes: its schema, by media type.
fn content_type(content: &Value) -> String {
    match content.as_object() {
        Some(types) if !types.is_empty() => types
            .iter()
            .map(|(media, c)| format!("{} (`{media}`)", type_of(&c["schema"], 0)))
            .collect::<Vec<_>>()
            .join(", "),
        _ => "—".to_owned(),
    }
}

/// A schema's type in words: a link for a named schema, `array of …`, `a | b`, `"x" | "y"`
/// for an enumeration.
fn type_of(schema: &Value, depth: usize) -> String {
    if let Some(target) = schema["$ref"].as_str() {
        let name = target.rsplit('/').next().unwrap_or(target);
        return format!("[{name}](#{})", name.to_lowercase());
    }
    if depth >= MAX_DEPTH {
        return "object".to_owned();
    }
    for key in ["oneOf", "anyOf", "allOf"] {
        if let Some(options) = schema[key].as_array() {
            let joiner = if key == "allOf" { " and " } else { " \\| " };
            return options
                .iter()
                .map(|o| type_of(o, depth + 1))
                .collect::<Vec<_>>()
                .join(joiner);
        }
    }
    if let Some(values) = schema["enum"].as_array() {
        return values
            .iter()
            .map(|v| format!("`{v}`"))
            .collect::<Vec<_>>()
            .join(" \\| ");
    }
    let types: Vec<String> = match &schema["type"] {
        Value::String(t) => vec![t.clone()],
        Value::Array(list) => list
            .iter()
            .filter_map(Value::as_str)
            .map(str::to_owned)
            .collect(),
        _ => Vec::new(),
    };
    let named: Vec<String> = types
        .iter()
        .map(|t| match t.as_str() {
            "array" => format!("array of {}", type_of(&schema["items"], depth + 1)),
            "string" => match schema["format"].as_str() {
                Some(format) => format!("string ({format})"),
                None => "string".to_owned(),
            },
            other => other.to_owned(),
        })
        .collect();
    match named.is_empty() {
        true => "any".to_owned(),
        false => named.join(" or "),
    }
}

/// `yes` or `no`.
fn yes_no(yes: bool) -> &'static str {
    if yes {
        "yes"
    } else {
        "no"
    }
}

/// Text made fit for one table cell: on one line, its bars escaped.
fn cell(text: &str) -> String {
    text.split_whitespace()
        .collect::<Vec<_>>()
        .join(" ")
        .replace('|', "\\|")
}
