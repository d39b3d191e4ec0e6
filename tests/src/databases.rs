//! Databases of a test: one service's alone ([`ServiceDb`]), and the cleanup of a whole
//! namespace.

use postmesh_shared::jetstream::Stream;
use postmesh_shared::proto::Role;
use postmesh_shared::{Common, Namespace, Service};

use crate::settings::{admin_url, common_of, fresh_namespace};
use crate::wait::on_a_fresh_runtime;

/// One service's database in a fresh namespace, migrated, and nothing else running: for
/// testing a service's router (`oneshot`) and queries with only Postgres. Dropped with it.
pub struct ServiceDb {
    pub common: Common,
    pub pool: sqlx::PgPool,
}

impl ServiceDb {
    /// Creates `service`'s database in a fresh namespace and runs `migrations`.
    pub async fn create(service: Service, migrations: &[&sqlx::migrate::Migrator]) -> Self {
        Self::within(fresh_namespace(), service, migrations).await
    }

    /// Creates `service`'s database in namespace `ns` (beside another service's) and runs
    /// `migrations`.
    pub async fn within(
        ns: Namespace, service: Service, migrations: &[&sqlx::migrate::Migrator],
    ) -> Self {
        let common = common_of(ns, &[service]);
        let pool = postmesh_shared::db::connect(&common, service, migrations)
            .await
            .expect("service database");
        Self { common, pool }
    }
}

impl Drop for ServiceDb {
    fn drop(&mut self) {
        // No `pool.close()` here: its connections belong to the test's runtime, which is
        // blocked in this drop, so closing them could wait forever. `DROP DATABASE ... WITH
        // (FORCE)` ends them from the server side instead.
        let ns = self.common.namespace.clone();
        on_a_fresh_runtime(move || async move { drop_databases(&ns).await });
    }
}

/// Drops the roles and databases of every service in `ns`.
pub(crate) async fn drop_databases(ns: &Namespace) {
    let admin = admin_url();
    let each = Service::ALL.map(|service| {
        let (admin, name) = (admin.clone(), service.database(ns));
        async move { postmesh_shared::db::drop_database(&admin, &name).await }
    });
    futures::future::join_all(each).await;
}

/// The context the gateway attaches for a fresh account with `role` (its workspace is its
/// account, as the gateway makes them), for calling a service's router directly.
pub fn caller(role: Role) -> postmesh_shared::proto::AuthContext {
    let account = uuid::Uuid::now_v7().to_string();
    let key = uuid::Uuid::now_v7().to_string();
    postmesh_shared::proto::AuthContext {
        workspace_id: account.clone(),
        account_id: account,
        api_key_id: key.clone(),
        key_id: key,
        role: role.into(),
        email: "owner@example.com".into(),
        test: false,
    }
}

/// Drops a namespace's databases, streams, object-store bucket and Redis keys.
pub async fn remove_namespace(common: &Common) {
    let ns = &common.namespace;
    drop_databases(ns).await;
    if let Ok(client) = crate::ops_nats(&common.nats_url).await {
        let js = async_nats::jetstream::new(client);
        for stream in Stream::ALL {
            let _ = js.delete_stream(stream.name(ns)).await;
        }
        let _ = js
            .delete_object_store(postmesh_shared::nats::bodies_bucket(ns))
            .await;
        let _ = js
            .delete_key_value(postmesh_shared::tracking_hosts::bucket(ns))
            .await;
    }
    if let Ok(client) = redis::Client::open(common.redis_url.as_str()) {
        if let Ok(mut conn) = client.get_multiplexed_async_connection().await {
            let keys: Vec<String> = redis::cmd("KEYS")
                .arg(ns.redis_key("*"))
                .query_async(&mut conn)
                .await
                .unwrap_or_default();
            if !keys.is_empty() {
                let _: Result<(), _> = redis::cmd("DEL").arg(keys).query_async(&mut conn).await;
            }
        }
    }
}
