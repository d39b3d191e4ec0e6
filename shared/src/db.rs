//! Postgres setup: each service signs in as its own role and owns the database of the same
//! name, `{ns}_{service}`, made by [`bootstrap`]; it runs its own migrations, plus the kit's
//! (the outbox table) when it uses them.

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

/// Connects to the service's database as its own role (both `{ns}_{service}`, made by
/// [`bootstrap`]) and runs `migrations`.
pub async fn connect(
    common: &Common, service: Service, migrations: &[&Migrator],
) -> anyhow::Result<PgPool> {
    let name = service.database(&common.namespace);
    let mut options = PgConnectOptions::from_str(&common.database_url)
        .with_context(|| format!("invalid DATABASE_URL {:?}", redacted(&common.database_url)))?
        .username(&name)
        .database(&name);
    if let Some(password) = &common.database_password {
        options = options.password(password);
    }
    let pool = PgPoolOptions::new()
        .max_connections(common.db_max_connections)
        .acquire_timeout(common.db_acquire_timeout)
        .connect_with(options)
        .await
        .with_context(|| {
            format!(
                "connecting to database {name} as role {name} (`api-gateway bootstrap` makes \
                 both: `make run` runs it, on Kubernetes the postmesh-bootstrap Job)"
            )
        })?;
    let mut all: Vec<Migration> = migrations.iter().flat_map(|m| m.iter().cloned()).collect();
    all.sort_by_key(|m| m.version);
    Migrator::new(Combined(all))
        .await?
        .run(&pool)
        .await
        .with_context(|| format!("migrating database {name}"))?;
    Ok(pool)
}

/// Makes the role and the database of `service` in `ns`, both `{ns}_{service}`, over an
/// administrator's connection (`admin_url`, a role that may CREATEROLE and CREATEDB): the
/// role may log in (with `password`, if given) and nothing more; it owns its database, which
/// no other role may connect to, and everything in it. Run again, it changes nothing but the
/// password, and hands over objects an earlier version created as another role.
pub async fn bootstrap(
    admin_url: &str, ns: &crate::Namespace, service: Service, password: Option<&str>,
) -> anyhow::Result<()> {
    let name = service.database(ns);
    let admin = PgConnectOptions::from_str(admin_url)
        .with_context(|| format!("invalid DATABASE_ADMIN_URL {:?}", redacted(admin_url)))?;
    let mut conn = PgConnection::connect_with(&admin.clone().database("postgres"))
        .await
        .context("connecting to the Postgres server as its administrator")?;
    // The name is a validated namespace plus a service name: safe to quote.
    let role_exists: bool =
        sqlx::query_scalar("SELECT EXISTS (SELECT 1 FROM pg_roles WHERE rolname = $1)")
            .bind(&name)
            .fetch_one(&mut conn)
            .await?;
    if !role_exists {
        tolerate_duplicate(
            sqlx::query(&format!("CREATE ROLE \"{name}\""))
                .execute(&mut conn)
                .await,
        )
        .with_context(|| format!("creating role {name}"))?;
    }
    // The password is quoted by the server (format's %L), never spliced in here.
    let alter: String = sqlx::query_scalar(
        "SELECT format('ALTER ROLE %I LOGIN NOSUPERUSER NOCREATEDB NOCREATEROLE NOREPLICATION \
         NOBYPASSRLS PASSWORD %L', $1::text, $2::text)",
    )
    .bind(&name)
    .bind(password)
    .fetch_one(&mut conn)
    .await?;
    sqlx::query(&alter).execute(&mut conn).await?;
    let db_exists: bool =
        sqlx::query_scalar("SELECT EXISTS (SELECT 1 FROM pg_database WHERE datname = $1)")
            .bind(&name)
            .fetch_one(&mut conn)
            .await?;
    if db_exists {
        sqlx::query(&format!("ALTER DATABASE \"{name}\" OWNER TO \"{name}\""))
            .execute(&mut conn)
            .await?;
    } else {
        let created = sqlx::query(&format!("CREATE DATABASE \"{name}\" OWNER \"{name}\""))
            .execute(&mut conn)
            .await;
        tolerate_duplicate(created).with_context(|| format!("creating database {name}"))?;
    }
    sqlx::query(&format!("REVOKE ALL ON DATABASE \"{name}\" FROM PUBLIC"))
        .execute(&mut conn)
        .await?;
    conn.close().await.ok();

    let mut conn = PgConnection::connect_with(&admin.database(&name))
        .await
        .with_context(|| format!("connecting to database {name} as its administrator"))?;
    sqlx::query("SELECT set_config('postmesh.owner', $1, false)")
        .bind(&name)
        .execute(&mut conn)
        .await?;
    sqlx::raw_sql(HAND_OVER)
        .execute(&mut conn)
        .await
        .with_context(|| format!("handing the objects of {name} to its role"))?;
    conn.close().await.ok();
    Ok(())
}

/// Gives the schema `public` and everything in it to the role `postmesh.owner` names.
const HAND_OVER: &str = "
DO $$
DECLARE
  who text := current_setting('postmesh.owner');
  r record;
BEGIN
  EXECUTE format('ALTER SCHEMA public OWNER TO %I', who);
  FOR r IN SELECT c.oid::regclass AS rel FROM pg_class c
           WHERE c.relnamespace = 'public'::regnamespace AND c.relkind IN ('r', 'p', 'v', 'm', 'f')
             AND pg_get_userbyid(c.relowner) <> who LOOP
    EXECUTE format('ALTER TABLE %s OWNER TO %I', r.rel, who);
  END LOOP;
  FOR r IN SELECT c.oid::regclass AS rel FROM pg_class c
           WHERE c.relnamespace = 'public'::regnamespace AND c.relkind = 'S'
             AND pg_get_userbyid(c.relowner) <> who LOOP
    EXECUTE format('ALTER SEQUENCE %s OWNER TO %I', r.rel, who);
  END LOOP;
  FOR r IN SELECT t.oid::regtype AS typ FROM pg_type t
           WHERE t.typnamespace = 'public'::regnamespace AND t.typtype IN ('e', 'd')
             AND pg_get_userbyid(t.typowner) <> who LOOP
    EXECUTE format('ALTER TYPE %s OWNER TO %I', r.typ, who);
  END LOOP;
  FOR r IN SELECT p.oid::regprocedure AS fn FROM pg_proc p
           WHERE p.pronamespace = 'public'::regnamespace AND pg_get_userbyid(p.proowner) <> who LOOP
    EXECUTE format('ALTER ROUTINE %s OWNER TO %I', r.fn, who);
  END LOOP;
END $$";

/// `Ok` also for a duplicate name (duplicate_object, duplicate_database or unique_violation:
/// another replica or test got there first).
fn tolerate_duplicate<T>(result: Result<T, sqlx::Error>) -> Result<(), sqlx::Error> {
    match result {
        Ok(_) => Ok(()),
        Err(sqlx::Error::Database(e))
            if matches!(e.code().as_deref(), Some("42710" | "42P04" | "23505")) =>
        {
            Ok(())
        }
        Err(e) => Err(e),
    }
}

/// Drops a database and its role if they exist (test stacks clean up with this), over an
/// administrator's connection.
pub async fn drop_database(admin_url: &str, name: &str) -> anyhow::Result<()> {
    let server = PgConnectOptions::from_str(admin_url)?;
    let mut conn = PgConnection::connect_with(&server.database("postgres")).await?;
    sqlx::query(&format!("DROP DATABASE IF EXISTS \"{name}\" WITH (FORCE)"))
        .execute(&mut conn)
        .await?;
    sqlx::query(&format!("DROP ROLE IF EXISTS \"{name}\""))
        .execute(&mut conn)
        .await?;
    Ok(())
}

/// Whether the database answers (readiness).
pub async fn ping(pool: &PgPool) -> bool {
    sqlx::query("SELECT 1").execute(pool).await.is_ok()
}

/// The database's clock as a whole Unix second (rounded down), stable within a statement so
/// an index on the compared column serves it: what periodic jobs take due rows by, so
/// replicas with clocks of their own all see a row due at the same time.
pub const DB_SECOND: &str = "floor(extract(epoch FROM statement_timestamp()))::bigint";

/// Current Unix time in seconds, the unit of every stored timestamp.
pub fn now_unix() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs() as i64)
        .unwrap_or(0)
}

/// Microseconds since the Unix epoch.
pub fn now_micros() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| i64::try_from(d.as_micros()).unwrap_or(i64::MAX))
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
