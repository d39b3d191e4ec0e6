//! `api-gateway bootstrap`: each service's PostgreSQL role and database (`{ns}_{service}`),
//! made over the administrator's connection `DATABASE_ADMIN_URL`, with the password the
//! service will sign in with (`<SERVICE>_DATABASE_PASSWORD`, e.g.
//! `WEBHOOK_DISPATCHER_DATABASE_PASSWORD`; required in production). The services themselves
//! need no more than their own database: no CREATEDB, no other database.

use anyhow::bail;

use postmesh_shared::config::{Setting, POSTMESH_ENV, POSTMESH_NAMESPACE};
use postmesh_shared::{Namespace, Service};

use crate::settings::*;

/// The setting that holds `service`'s database password (the SMTP edge has no database).
fn password_setting(service: Service) -> Option<&'static Setting> {
    Some(match service {
        Service::ApiGateway => &API_GATEWAY_DATABASE_PASSWORD,
        Service::Billing => &BILLING_DATABASE_PASSWORD,
        Service::Sender => &SENDER_DATABASE_PASSWORD,
        Service::Domain => &DOMAIN_DATABASE_PASSWORD,
        Service::InboundIngest => &INBOUND_INGEST_DATABASE_PASSWORD,
        Service::WebhookDispatcher => &WEBHOOK_DISPATCHER_DATABASE_PASSWORD,
        Service::SmtpSubmission => return None,
    })
}

/// Makes the role and the database of every service in `POSTMESH_NAMESPACE`.
pub async fn run() -> anyhow::Result<()> {
    let ns = Namespace::parse(&POSTMESH_NAMESPACE.string())?;
    let admin_url = DATABASE_ADMIN_URL.string();
    let production = POSTMESH_ENV.string() == "production";
    for service in Service::ALL {
        let Some(setting) = password_setting(service) else {
            continue;
        };
        let password = setting.opt();
        if production && password.is_none() {
            bail!("{} must be set in production", setting.name);
        }
        postmesh_shared::db::bootstrap(&admin_url, &ns, service, password.as_deref()).await?;
        eprintln!("bootstrap: role and database {}", service.database(&ns));
    }
    Ok(())
}
