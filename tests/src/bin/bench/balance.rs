//! `GET /balance` through the whole stack (gateway → NATS → billing → Postgres) against a
//! baseline: one axum + sqlx process answering the same request with the same query on the
//! same database ([`compare`](super::compare) runs and measures both).

use std::collections::HashMap;
use std::sync::Arc;

use axum::extract::State;
use axum::http::{header, HeaderMap, StatusCode};
use axum::routing::get;
use axum::{Json, Router};
use serde_json::{json, Value};
use sqlx::postgres::PgPoolOptions;
use sqlx::PgPool;
use uuid::Uuid;

use postmesh_tests::{workspace_binary, Stack};

use super::compare::{self, Ask, Goals, Load, Measured, Target};

/// The baseline's whole state: known keys and the billing database.
#[derive(Clone)]
struct Baseline {
    keys: Arc<HashMap<String, Uuid>>,
    db: PgPool,
}

async fn baseline_balance(
    State(b): State<Baseline>, headers: HeaderMap,
) -> Result<Json<Value>, StatusCode> {
    let key_id = headers
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("Bearer "))
        .and_then(|k| b.keys.get(k))
        .ok_or(StatusCode::UNAUTHORIZED)?;
    let balance: Option<i64> =
        sqlx::query_scalar("SELECT balance FROM balances WHERE api_key_id = $1")
            .bind(key_id)
            .fetch_optional(&b.db)
            .await
            .map_err(|_| StatusCode::INTERNAL_SERVER_ERROR)?;
    Ok(Json(
        json!({ "success": true, "balance": balance.unwrap_or(0) }),
    ))
}

/// The baseline's `/balance` when the baseline process was given its database
/// (`BENCH_BASELINE_DB`, with `BENCH_BASELINE_KEY`, `BENCH_BASELINE_KEY_ID` and
/// `DB_MAX_CONNECTIONS`); no route otherwise.
pub async fn baseline() -> anyhow::Result<Router> {
    let Ok(url) = std::env::var("BENCH_BASELINE_DB") else {
        return Ok(Router::new());
    };
    let var = |name: &str| std::env::var(name).map_err(|_| anyhow::anyhow!("{name} unset"));
    let db = PgPoolOptions::new()
        .max_connections(var("DB_MAX_CONNECTIONS")?.parse()?)
        .connect(&url)
        .await?;
    let state = Baseline {
        keys: Arc::new(HashMap::from([(
            var("BENCH_BASELINE_KEY")?,
            var("BENCH_BASELINE_KEY_ID")?.parse()?,
        )])),
        db,
    };
    Ok(Router::new()
        .route("/balance", get(baseline_balance))
        .with_state(state))
}

/// The benchmark: billing and a gateway started as child processes in place of the stack's
/// in-process billing (started again afterwards), the baseline as a third.
pub async fn run(stack: &mut Stack, load: &Load) -> anyhow::Result<()> {
    anyhow::ensure!(
        workspace_binary("api-gateway").exists() && workspace_binary("billing").exists(),
        "build the gateway and billing first (make bench does)"
    );
    let key = stack.key(1).await;
    stack.stop_billing().await;
    let (billing, gateway, base) = stack.spawn_gateway_and_billing().await;
    let db = format!(
        "{}/{}",
        stack.common.database_url,
        billing::SERVICE.database(stack.ns())
    );
    let (baseline_addr, baseline) = compare::spawn_baseline(vec![
        ("BENCH_BASELINE_DB", db),
        ("BENCH_BASELINE_KEY", key.clone()),
        (
            "BENCH_BASELINE_KEY_ID",
            stack.key_id(&key).await.to_string(),
        ),
        (
            "DB_MAX_CONNECTIONS",
            stack.common.db_max_connections.to_string(),
        ),
    ])?;
    let compared = compare::compare(
        "GET /balance",
        Target::new(
            "baseline (axum + sqlx, one process)",
            format!("http://{baseline_addr}/balance"),
            vec![
                Measured::pid("baseline", baseline.id()),
                Measured::named("postgres"),
            ],
        ),
        Target::new(
            "postmesh gateway → NATS → billing",
            format!("{base}/balance"),
            vec![
                Measured::pid("gateway", gateway.id()),
                Measured::pid("billing", billing.id()),
                Measured::named("nats-server"),
                Measured::named("postgres"),
            ],
        ),
        &Ask {
            header: (header::AUTHORIZATION, format!("Bearer {key}")),
            expected: StatusCode::OK,
        },
        load,
        &Goals {
            throughput: 0.5,
            p99: 2.0,
        },
    )
    .await;
    drop((billing, gateway, baseline));
    stack.start_billing().await;
    compared.map(|_| ())
}
