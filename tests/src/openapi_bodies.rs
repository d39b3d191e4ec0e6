//! The file of body schemas the gateway's OpenAPI document includes
//! (`services/api-gateway/src/openapi_bodies.json`), written from every service's routes
//! and the types they document: the gateway cannot link the services, this crate does.

use std::collections::btree_map::Entry;
use std::collections::BTreeMap;

use serde_json::{json, Map, Value};

use api_gateway::openapi::operation_id;

/// Where the gateway includes the file from.
pub const PATH: &str = concat!(
    env!("CARGO_MANIFEST_DIR"),
    "/../services/api-gateway/src/openapi_bodies.json"
);

/// The file's text: each operation's request and answer schema names and query parameters,
/// and every schema.
///
/// # Panics
/// When two different schemas share a name (rename one with `#[schema(as = …)]`).
pub fn render() -> String {
    let mut operations = BTreeMap::new();
    let mut schemas: BTreeMap<String, Value> = BTreeMap::new();
    let routes = [
        api_gateway::routes::bodies(),
        billing::routes().bodies(),
        domain::routes().bodies(),
        inbound_ingest::routes().bodies(),
        sender::routes().bodies(),
        webhook_dispatcher::routes::routes().bodies(),
    ];
    for (spec, bodies) in routes.into_iter().flatten() {
        let mut operation = Map::new();
        for (field, body) in [("request", &bodies.request), ("answer", &bodies.answer)] {
            let Some(body) = body else { continue };
            operation.insert(field.into(), json!(body.name));
            for (name, schema) in &body.schemas {
                let schema = serde_json::to_value(schema).expect("a schema serializes");
                match schemas.entry(name.clone()) {
                    Entry::Vacant(slot) => {
                        slot.insert(schema);
                    }
                    Entry::Occupied(slot) => assert_eq!(
                        slot.get(),
                        &schema,
                        "two types are named {name}: rename one with #[schema(as = …)]"
                    ),
                }
            }
        }
        if !bodies.parameters.is_empty() {
            let parameters =
                serde_json::to_value(&bodies.parameters).expect("parameters serialize");
            operation.insert("parameters".into(), parameters);
        }
        if bodies.request_optional {
            operation.insert("requestOptional".into(), json!(true));
        }
        if !operation.is_empty() {
            operations.insert(operation_id(spec.method, spec.path), operation);
        }
    }
    let file = json!({"operations": operations, "schemas": schemas});
    serde_json::to_string_pretty(&file).expect("the file serializes") + "\n"
}
