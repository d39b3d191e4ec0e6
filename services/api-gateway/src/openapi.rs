//! The API's OpenAPI 3.1 document (`GET /openapi.json`) and a readable reference of it
//! (`GET /docs`), built once from the gateway's route table: every route of every service,
//! with its path parameters, who may call it (the policy as a security scheme) and the
//! spec's error body (HTML pages for the web app's and unsubscribe routes), and the JSON
//! bodies and query and header parameters each route takes and answers, as the services' own types
//! describe them.

use std::collections::BTreeMap;
use std::sync::OnceLock;

use axum::http::header;
use axum::response::{IntoResponse, Response};
use utoipa::openapi::path::{
    HttpMethod, OperationBuilder, ParameterBuilder, ParameterIn, PathsBuilder,
};
use utoipa::openapi::schema::{KnownFormat, ObjectBuilder, SchemaFormat, Type};
use utoipa::openapi::security::{
    ApiKey, ApiKeyValue, Http, HttpAuthScheme, SecurityRequirement, SecurityScheme,
};
use utoipa::openapi::{
    ComponentsBuilder, ContentBuilder, InfoBuilder, OpenApi, OpenApiBuilder, Ref, Required,
    ResponseBuilder,
};

use postmesh_contracts::routes::{gateway as api, sender, HttpMethod as Method};
use postmesh_contracts::{Policy, RouteSpec};
use postmesh_shared::Routes;

use crate::table::{table, Target};
use crate::AppState;

/// Routes that answer HTML pages besides those of the `Page` policy.
const PAGES: [RouteSpec; 7] = [
    api::APP,
    api::APP_LOGIN,
    api::APP_LOGIN_SEND,
    api::APP_LOGIN_VERIFY,
    api::DOCS,
    sender::UNSUBSCRIBE_PAGE,
    sender::UNSUBSCRIBE,
];

/// Path parameters that are ids: every service parses them as uuids (any other text is
/// not found or a 400).
const UUID_PARAMETERS: [&str; 4] = ["id", "task_id", "attemptId", "delivery_id"];

/// The gateway's route that serves the document.
pub fn routes() -> Routes<AppState> {
    Routes::new().at(api::OPENAPI, openapi_json)
}

/// `GET /openapi.json`, rendered once.
async fn openapi_json() -> Response {
    static RENDERED: OnceLock<String> = OnceLock::new();
    let json = RENDERED.get_or_init(|| {
        serde_json::to_string_pretty(&document()).expect("the document serializes")
    });
    ([(header::CONTENT_TYPE, "application/json")], json.as_str()).into_response()
}

/// The body schemas of every service's routes, written from the services' types by the
/// tests crate (`make openapi`; a test fails when this file is not current).
const BODIES: &str = include_str!("openapi_bodies.json");

/// [`BODIES`]: each operation's bodies by schema name, and the schemas.
#[derive(serde::Deserialize)]
struct BodiesFile {
    operations: BTreeMap<String, OperationBodies>,
    schemas: serde_json::Map<String, serde_json::Value>,
}

/// The bodies of one operation, by schema name.
#[derive(serde::Deserialize)]
#[serde(rename_all = "camelCase")]
struct OperationBodies {
    request: Option<String>,
    #[serde(default)]
    request_optional: bool,
    answer: Option<String>,
    #[serde(default)]
    parameters: Vec<serde_json::Value>,
}

/// Adds [`BODIES`] to `doc`: each operation's request body, successful answer and query
/// and header parameters, and the schemas they refer to.
fn add_bodies(doc: &mut serde_json::Value) {
    let file: BodiesFile = serde_json::from_str(BODIES).expect("openapi_bodies.json parses");
    let json = |name: &str| serde_json::json!({"application/json": {"schema": {"$ref": format!("#/components/schemas/{name}")}}});
    for item in doc["paths"].as_object_mut().expect("paths").values_mut() {
        for operation in item.as_object_mut().expect("a path item").values_mut() {
            let id = operation["operationId"].as_str().expect("an operation id");
            let Some(bodies) = file.operations.get(id) else {
                continue;
            };
            if let Some(name) = &bodies.request {
                operation["requestBody"] = serde_json::json!({"content": json(name), "required": !bodies.request_optional});
            }
            if let Some(name) = &bodies.answer {
                operation["responses"]["2XX"]["content"] = json(name);
            }
            if !bodies.parameters.is_empty() {
                let parameters = &mut operation["parameters"];
                if parameters.is_null() {
                    *parameters = serde_json::json!([]);
                }
                let list = parameters.as_array_mut().expect("parameters are a list");
                list.extend(bodies.parameters.iter().cloned());
            }
        }
    }
    let schemas = doc["components"]["schemas"]
        .as_object_mut()
        .expect("component schemas");
    schemas.extend(file.schemas);
}

/// The security scheme a policy stands for; `None` for public routes.
fn scheme(policy: Policy) -> Option<(&'static str, SecurityScheme)> {
    let header_key = |name: &str, what: &str| {
        SecurityScheme::ApiKey(ApiKey::Header(ApiKeyValue::with_description(name, what)))
    };
    let cookie = || {
        SecurityScheme::ApiKey(ApiKey::Cookie(ApiKeyValue::with_description(
            "pm_session",
            "a web session, from POST /app/login/verify or /verify-code-login",
        )))
    };
    match policy {
        Policy::Public => None,
        Policy::Key => Some((
            "apiKey",
            SecurityScheme::Http(Http::new(HttpAuthScheme::Bearer)),
        )),
        Policy::InboundSecret => Some((
            "inboundSecret",
            header_key(
                "x-service-inbound-secret",
                "the upstream MTA's shared secret (INBOUND_SECRET)",
            ),
        )),
        Policy::ProviderSecret => Some((
            "providerSecret",
            header_key(
                "x-service-provider-secret",
                "the mail provider's shared secret (PROVIDER_SECRET)",
            ),
        )),
        Policy::Session => Some(("session", cookie())),
        Policy::Page => Some(("pageSession", cookie())),
    }
}

fn http_method(method: Method) -> HttpMethod {
    match method {
        Method::Get => HttpMethod::Get,
        Method::Post => HttpMethod::Post,
        Method::Put => HttpMethod::Put,
        Method::Patch => HttpMethod::Patch,
        Method::Delete => HttpMethod::Delete,
    }
}

/// `get_webhooks_id_replay` for `GET /webhooks/{id}/replay`: unique, as method and path are.
pub fn operation_id(method: Method, path: &str) -> String {
    let words: Vec<String> = path
        .split(['/', '-', '.', '{', '}'])
        .filter(|w| !w.is_empty())
        .map(str::to_lowercase)
        .collect();
    format!("{}_{}", method.as_str().to_lowercase(), words.join("_"))
}

/// The names of `path`'s parameters (`{id}`).
fn parameters(path: &str) -> impl Iterator<Item = &str> {
    path.split('/')
        .filter_map(|segment| segment.strip_prefix('{')?.strip_suffix('}'))
}

/// The OpenAPI document of the gateway's route table, with the routes' bodies.
pub fn document() -> serde_json::Value {
    let mut doc = serde_json::to_value(operations()).expect("the document serializes");
    add_bodies(&mut doc);
    doc
}

/// The document's operations: paths, parameters, security and error bodies.
fn operations() -> OpenApi {
    let error = ObjectBuilder::new()
        .property("success", ObjectBuilder::new().schema_type(Type::Boolean))
        .property("error", ObjectBuilder::new().schema_type(Type::String))
        .required("success")
        .required("error");
    // Two routes answer errors in shapes of their own (spec §6 rule 2); /smtp-auth's
    // refusals by the gateway itself (401, 413) are the common body, so only `error` is
    // common to all of its errors.
    let smtp_auth = ObjectBuilder::new()
        .property(
            "authenticated",
            ObjectBuilder::new().schema_type(Type::Boolean),
        )
        .property("username", ObjectBuilder::new().schema_type(Type::String))
        .property("success", ObjectBuilder::new().schema_type(Type::Boolean))
        .property("error", ObjectBuilder::new().schema_type(Type::String))
        .required("error");
    let poll = ObjectBuilder::new()
        .property("success", ObjectBuilder::new().schema_type(Type::Boolean))
        .property("status", ObjectBuilder::new().schema_type(Type::String))
        .property("error", ObjectBuilder::new().schema_type(Type::String))
        .required("success");
    let mut components = ComponentsBuilder::new()
        .schema("Error", error)
        .schema("SmtpAuthAnswer", smtp_auth)
        .schema("PollAnswer", poll);
    let mut paths = PathsBuilder::new();
    for entry in table() {
        let spec = entry.spec;
        let owner = owner_name(entry.target);
        let json = |description: &str, schema: &str| {
            ResponseBuilder::new().description(description).content(
                "application/json",
                ContentBuilder::new()
                    .schema(Some(Ref::from_schema_name(schema)))
                    .build(),
            )
        };
        // Bodies of successful answers are not described yet; pages answer HTML, errors
        // included, and a page without a session redirects to the login page.
        let page = spec.policy == Policy::Page || PAGES.contains(&spec);
        let error_schema = match spec {
            s if s == sender::SMTP_AUTH => "SmtpAuthAnswer",
            s if s == api::CLI_AUTH_POLL => "PollAnswer",
            _ => "Error",
        };
        let error = |description: &str| match page {
            true => ResponseBuilder::new().description(description),
            false => json(description, error_schema),
        };
        let mut operation = OperationBuilder::new()
            .operation_id(Some(operation_id(spec.method, spec.path)))
            .summary(Some(format!("{} {}", spec.method.as_str(), spec.path)))
            .tag(owner)
            .response("2XX", ResponseBuilder::new().description("done"))
            .response("4XX", error("refused, with the spec's status code"))
            .response("5XX", error("failed, or a service unavailable (502, 503)"));
        if spec.policy == Policy::Page {
            operation = operation.response(
                "303",
                ResponseBuilder::new().description("no session: to /app/login"),
            );
        }
        // The tracking paths answer a redirect and an image, for mail clients and browsers.
        if spec == api::TRACK_CLICK {
            operation = operation.response(
                "302",
                ResponseBuilder::new().description("to the link's signed destination"),
            );
        }
        if spec == api::TRACK_OPEN {
            operation = operation.response(
                "2XX",
                ResponseBuilder::new()
                    .description("a transparent 1×1 GIF")
                    .content("image/gif", ContentBuilder::new().build()),
            );
        }
        if let Some((name, security)) = scheme(spec.policy) {
            components = components.security_scheme(name, security);
            operation = operation.security(SecurityRequirement::new::<_, _, &str>(name, []));
        }
        for name in parameters(spec.path) {
            let mut schema = ObjectBuilder::new().schema_type(Type::String);
            if UUID_PARAMETERS.contains(&name) {
                schema = schema.format(Some(SchemaFormat::KnownFormat(KnownFormat::Uuid)));
            }
            operation = operation.parameter(
                ParameterBuilder::new()
                    .name(name)
                    .parameter_in(ParameterIn::Path)
                    .required(Required::True)
                    .schema(Some(schema)),
            );
        }
        paths = paths.path(
            spec.path,
            utoipa::openapi::PathItem::new(http_method(spec.method), operation),
        );
    }
    OpenApiBuilder::new()
        .info(
            InfoBuilder::new()
                .title("Postmesh API")
                .version(env!("CARGO_PKG_VERSION"))
                .description(Some(
                    "Every route the gateway serves. Errors are `{success: false, error}` with \
                     the status codes of the API specification.",
                )),
        )
        .paths(paths)
        .components(Some(components.build()))
        .build()
}

/// The service that serves a route.
pub(crate) fn owner_name(target: Target) -> String {
    match target {
        Target::Gateway => "api-gateway".to_owned(),
        Target::Service(service) => service.name().to_owned(),
    }
}

/// Who may call a route, in words.
pub(crate) fn who(policy: Policy) -> &'static str {
    match policy {
        Policy::Public => "anyone",
        Policy::Key => "an API key (Authorization: Bearer)",
        Policy::InboundSecret => "the upstream MTA (x-service-inbound-secret)",
        Policy::ProviderSecret => "the mail provider (x-service-provider-secret)",
        Policy::Session => "a signed-in web session (pm_session cookie)",
        Policy::Page => "a signed-in web session; otherwise a redirect to /app/login",
    }
}
