//! `api-gateway bootstrap`: each service's PostgreSQL role and database (`{ns}_{service}`),
//! made over the administrator's connection `DATABASE_ADMIN_URL`, with the password the
//! service will sign in with (`<SERVICE>_DATABASE_PASSWORD`, e.g.
//! `WEBHOOK_DISPATCHER_DATABASE_PASSWORD`; required in production). The services themselves
//! need no more than their own database: no CREATEDB, no other database.

use anyhow::bail;

use postmesh_shared::config::{env_opt, env_or};
use postmesh_shared::{Namespace, Service};

/// The administrator's connection when `DATABASE_ADMIN_URL` is unset: a developer's server.
pub const DEFAULT_ADMIN_URL: &str = "postgres://postgres@127.0.0.1:5432";

/// The setting that holds `service`'s database password.
pub fn password_setting(service: Service) -> String {
    format!(
        "{}_DATABASE_PASSWORD",
        service.name().replace('-', "_").to_ascii_uppercase()
    )
}

/// Makes the role and the database of every service in `POSTMESH_NAMESPACE`.
pub async fn run() -> anyhow::Result<()> {
    let ns = Namespace::parse(&env_or("POSTMESH_NAMESPACE", "pm"))?;
    let admin_url = env_or("DATABASE_ADMIN_URL", DEFAULT_ADMIN_URL);
    let production = env_or("POSTMESH_ENV", "development") == "production";
    for service in Service::ALL {
        let setting = password_setting(service);
        let password = env_opt(&setting);
        if production && password.is_none() {
            bail!("{setting} must be set in production");
        }
        postmesh_shared::db::bootstrap(&admin_url, &ns, service, password.as_deref()).await?;
        eprintln!("bootstrap: role and database {}", service.database(&ns));
    }
    Ok(())
}
