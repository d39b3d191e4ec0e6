//! Postgres setup: each service owns the database `{ns}_{service}`, created on first start,
//! and runs its own migrations.

use std::str::FromStr;
use std::time::Duration;

use anyhow::Context;
use sqlx::migrate::Migrator;
use sqlx::postgres::{PgConnectOptions, PgPoolOptions};
use sqlx::{Connection, PgConnection, PgPool};

use crate::config::Common;

/// Connects to the service's database, creating it if needed, and runs `migrator`.
pub async fn connect(
    common: &Common,
    service: &str,
    migrator: &Migrator,
) -> anyhow::Result<PgPool> {
    let name = common.namespace.database(service);
    let server = PgConnectOptions::from_str(&common.database_url)
        .with_context(|| format!("invalid DATABASE_URL {:?}", common.database_url))?;
    create_database(&server, &name).await?;
    let pool = PgPoolOptions::new()
        .max_connections(common.db_max_connections)
        .acquire_timeout(Duration::from_secs(5))
        .connect_with(server.database(&name))
        .await
        .with_context(|| format!("connecting to database {name}"))?;
    migrator
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
