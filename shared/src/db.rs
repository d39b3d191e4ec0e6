//! Postgres setup: each service owns the database `{ns}_{service}`, created on first start,
//! and runs its own migrations, plus the kit's (the outbox table) when it uses them.

use std::str::FromStr;

use anyhow::Context;
use futures::future::BoxFuture;
use sqlx::error::BoxDynError;
use sqlx::migrate::{Migration, MigrationSource, Migrator};
use sqlx::postgres::{PgConnectOptions, PgPoolOptions};
use sqlx::{Connection, PgConnection, PgPool};

use crate::config::{redacted, Common};
use crate::service::Service;

/// Tables of the service kit (the outbox), versions 9001 and up; a service that uses them
/// runs them beside its own migrations, whose versions stay below 9000.
pub static KIT_MIGRATIONS: Migrator = sqlx::migrate!("./migrations");

/// Several migration sets run as one, in version order.
#[derive(Debug)]
struct Combined(Vec<Migration>);

impl MigrationSource<'static> for Combined {
    fn resolve(self) -> BoxFuture<'static, Result<Vec<Migration>, BoxDynError>> {
        Box::pin(async move { Ok(self.0) })
    }
}

/// Connects to the service's database, creating it if needed, and runs `migrations`.
pub async fn connect(
    common: &Common, service: Service, migrations: &[&Migrator],
) -> anyhow::Result<PgPool> {
    let name = service.database(&common.namespace);
    let server = PgConnectOptions::from_str(&common.database_url)
        .with_context(|| format!("invalid DATABASE_URL {:?}", redacted(&common.database_url)))?;
    create_database(&server, &name).await?;
    let pool = PgPoolOptions::new()
        .max_connections(common.db_max_connections)
        .acquire_timeout(common.db_acquire_timeout)
        .connect_with(server.database(&name))
        .await
        .with_context(|| format!("connecting to database {name}"))?;
    let mut all: Vec<Migration> = migrations.iter().flat_map(|m| m.iter().cloned()).collect();
    all.sort_by_key(|m| m.version);
    Migrator::new(Combined(all))
        .await?
        .run(&pool)
        .await
        .with_context(|| format!("migrating database {name}"))?;
    Ok(pool)
}

/// Creates the database unless it exists (tolerating a concurrent creator).
async fn create_database(server: &PgConnectOptions, name: &str) -> anyhow::Result<()> {
    let mut conn = PgConnection::connect_with(&server.clone().database("postgres"))
        .await
        .context("connecting to the Postgres server")?;
    let exists: bool =
        sqlx::query_scalar("SELECT EXISTS (SELECT 1 FROM pg_database WHERE datname = $1)")
            .bind(name)
            .fetch_one(&mut conn)
            .await?;
    if !exists {
        // The name is a validated namespace plus a service name: safe to quote.
        let created = sqlx::query(&format!("CREATE DATABASE \"{name}\""))
            .execute(&mut conn)
            .await;
        match created {
            Ok(_) => {}
            // duplicate_database / unique_violation: another replica won the race.
            Err(sqlx::Error::Database(e))
                if matches!(e.code().as_deref(), Some("42P04") | Some("23505")) => {}
            Err(e) => return Err(e).with_context(|| format!("creating database {name}")),
        }
    }
    conn.close().await.ok();
    Ok(())
}

/// Drops a database if it exists (test stacks clean up with this).
pub async fn drop_database(database_url: &str, name: &str) -> anyhow::Result<()> {
    let server = PgConnectOptions::from_str(database_url)?;
    let mut conn = PgConnection::connect_with(&server.database("postgres")).await?;
    sqlx::query(&format!("DROP DATABASE IF EXISTS \"{name}\" WITH (FORCE)"))
        .execute(&mut conn)
        .await?;
    Ok(())
}

/// Whether the database answers (readiness).
pub async fn ping(pool: &PgPool) -> bool {
    sqlx::query("SELECT 1").execute(pool).await.is_ok()
}

/// Current Unix time in seconds, the unit of every stored timestamp.
pub fn now_unix() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs() as i64)
        .unwrap_or(0)
}

/// What a transaction-scoped advisory lock serializes; each has its own key space.
#[derive(Clone, Copy, Debug)]
pub enum Turns {
    /// A workspace's creations within a plan limit (count, then insert).
    Workspace = 0,
    /// Writes into one inbox (dedup check, thread choice, insert).
    Inbox = 1,
    /// A workspace's sends against its monthly quota.
    Quota = 7,
}

/// Makes the caller's transaction take turns with every other that locks `id` for `what`,
/// until it commits or rolls back (`pg_advisory_xact_lock`).
pub async fn take_turns(
    tx: &mut PgConnection, what: Turns, id: impl Into<uuid::Uuid>,
) -> Result<(), sqlx::Error> {
    sqlx::query("SELECT pg_advisory_xact_lock(hashtextextended($1::text, $2))")
        .bind(id.into())
        .bind(what as i64)
        .execute(tx)
        .await
        .map(drop)
}

/// Whether `e` is a unique-constraint violation (SQLSTATE 23505).
pub fn is_unique_violation(e: &sqlx::Error) -> bool {
    matches!(e, sqlx::Error::Database(d) if d.code().as_deref() == Some("23505"))
}
