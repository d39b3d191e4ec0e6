//! `GET /admin/dead-letters` and `POST /admin/dead-letters/{id}/requeue` (admin keys): the
//! stream messages each consuming service kept aside, asked of each over NATS, and one put
//! back on its subject.

use axum::body::Bytes;
use axum::extract::State;
use axum::Extension;
use base64::Engine as _;
use serde::Serialize;
use uuid::Uuid;

use postmesh_contracts::routes::gateway as api;
use postmesh_shared::extract::{IdPath, PageQuery, QueryParams};
use postmesh_shared::proto::{
    AuthContext, DeadLetter, DeadLettersRequest, RequeueDeadLetterRequest, Role,
};
use postmesh_shared::{nats, ApiError, Routes, Service, Success};

use crate::AppState;

/// A page's default size.
const DEFAULT_LIMIT: i64 = 50;

/// The dead-letter routes.
pub fn routes() -> Routes<AppState> {
    Routes::new()
        .at(api::DEAD_LETTERS, list)
        .at(api::DEAD_LETTER_REQUEUE, requeue)
}

/// Each consuming service's dead letters.
#[derive(Debug, Serialize, utoipa::ToSchema)]
pub struct DeadLetterList {
    pub services: Vec<ServiceLetters>,
}

/// One service's dead letters: a page, newest first, and how many it keeps.
#[derive(Debug, Serialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct ServiceLetters {
    pub service: String,
    pub total: i64,
    pub dead_letters: Vec<Letter>,
}

/// A message kept aside.
#[derive(Debug, Serialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct Letter {
    pub id: String,
    pub stream: String,
    pub subject: String,
    /// The message as it was, base64: its first 4096 bytes (all of it when `payloadBytes`
    /// is no more).
    pub payload: String,
    /// The whole message's size.
    pub payload_bytes: i64,
    pub last_error: String,
    /// Failures before it was kept aside.
    pub count: i32,
    pub created_at: i64,
    pub dead_at: i64,
}

/// Which service put the dead letter back.
#[derive(Debug, Serialize, utoipa::ToSchema)]
pub struct Requeued {
    pub service: String,
}

/// 403 unless the caller's key has the admin role.
fn require_admin(auth: &AuthContext) -> Result<(), ApiError> {
    if auth.role == Role::Admin as i32 {
        Ok(())
    } else {
        Err(ApiError::Forbidden(
            "dead letters are for admin keys".into(),
        ))
    }
}

async fn list(
    State(state): State<AppState>, Extension(auth): Extension<AuthContext>,
    QueryParams(q): QueryParams<PageQuery>,
) -> Result<Success<DeadLetterList>, ApiError> {
    require_admin(&auth)?;
    let page = q.page(DEFAULT_LIMIT)?;
    let req = DeadLettersRequest {
        limit: page.limit,
        offset: page.offset,
    };
    let asks =
        Service::CONSUMERS.map(|service| nats::call_on(&state.nats, &state.ns, service, &req));
    let answers = futures::future::try_join_all(asks).await?;
    let services = Service::CONSUMERS
        .into_iter()
        .zip(answers)
        .map(|(service, reply)| ServiceLetters {
            service: service.name().to_owned(),
            total: reply.total,
            dead_letters: reply.dead_letters.into_iter().map(letter).collect(),
        })
        .collect();
    Ok(Success::new(DeadLetterList { services }))
}

fn letter(l: DeadLetter) -> Letter {
    Letter {
        id: l.id,
        stream: l.stream,
        subject: l.subject,
        payload: base64::engine::general_purpose::STANDARD.encode(&l.payload),
        payload_bytes: l.payload_bytes,
        last_error: l.last_error,
        count: l.count,
        created_at: l.created_at,
        dead_at: l.dead_at,
    }
}

/// The body is ignored, but read within the route's limit like any other (413 beyond).
async fn requeue(
    State(state): State<AppState>, Extension(auth): Extension<AuthContext>,
    IdPath(id): IdPath<Uuid>, _body: Bytes,
) -> Result<Success<Requeued>, ApiError> {
    require_admin(&auth)?;
    let req = RequeueDeadLetterRequest { id: id.to_string() };
    for service in Service::CONSUMERS {
        if nats::call_on(&state.nats, &state.ns, service, &req)
            .await?
            .found
        {
            return Ok(Success::new(Requeued {
                service: service.name().to_owned(),
            }));
        }
    }
    Err(ApiError::NotFound("no such dead letter waiting".into()))
}
