//! Which domain holds each verified customer tracking host, in a JetStream key-value bucket
//! (`{ns}_TRACKING_HOSTS`: `track.<domain>` → the domain's id). The domain service writes it
//! as hosts are verified, lost or removed ([`HostsWriter`]); the gateway keeps a copy in
//! memory, current through a watch ([`VerifiedHosts`]), and answers a tracking path on a
//! customer's host only with a token bound to the domain that holds the host now.

use std::collections::HashMap;
use std::sync::{Arc, RwLock};
use std::time::Duration;

use async_nats::jetstream::kv::{self, Operation};
use async_nats::jetstream::{self};
use futures::StreamExt;
use tokio_util::sync::CancellationToken;
use uuid::Uuid;

use crate::error::ApiError;
use crate::tracking::canonical_host;
use crate::Namespace;

/// `{ns}_TRACKING_HOSTS`: the bucket's name.
pub fn bucket(ns: &Namespace) -> String {
    ns.stream("TRACKING_HOSTS")
}

/// The bucket, made with `replicas` unless it exists (every service at its start).
pub async fn ensure(
    js: &jetstream::Context, ns: &Namespace, replicas: usize,
) -> anyhow::Result<kv::Store> {
    let bucket = bucket(ns);
    if let Ok(store) = js.get_key_value(&bucket).await {
        return Ok(store);
    }
    let config = kv::Config {
        bucket: bucket.clone(),
        description: "verified customer tracking hosts and the domain holding each".into(),
        history: 1,
        num_replicas: replicas,
        ..Default::default()
    };
    let what = format!("the bucket {bucket}");
    crate::placement::until_placed(&what, || js.create_key_value(config.clone())).await
}

/// The domain service's side: which domain holds a host.
#[derive(Clone)]
pub struct HostsWriter {
    store: kv::Store,
}

impl HostsWriter {
    /// Writes to `store` (see [`ensure`]).
    pub fn new(store: kv::Store) -> Self {
        Self { store }
    }

    /// `host` is verified for `domain`: its tokens answer there.
    pub async fn hold(&self, host: &str, domain: Uuid) -> Result<(), ApiError> {
        let value = domain.as_bytes().to_vec().into();
        self.store
            .put(canonical_host(host), value)
            .await
            .map(drop)
            .map_err(|e| ApiError::unavailable("could not record the tracking host", e))
    }

    /// `host` is not `domain`'s verified tracking host (any more): no token of it answers
    /// there. A host another domain holds now stays held (a release of a domain removed,
    /// coming after the name was added again elsewhere, never takes it away).
    pub async fn release(&self, host: &str, domain: Uuid) -> Result<(), ApiError> {
        let failed = "could not withdraw the tracking host";
        let host = canonical_host(host);
        let entry = self.store.entry(host.as_str()).await;
        let Some(entry) = entry.map_err(|e| ApiError::unavailable(failed, e))? else {
            return Ok(());
        };
        if entry.operation != Operation::Put || entry.value.as_ref() != domain.as_bytes() {
            return Ok(());
        }
        match self
            .store
            .delete_expect_revision(host.as_str(), Some(entry.revision))
            .await
        {
            Ok(()) => Ok(()),
            // Written meanwhile: by a hold of another domain, or a release.
            Err(e) if e.kind() == kv::DeleteErrorKind::WrongLastRevision => Ok(()),
            Err(e) => Err(ApiError::unavailable(failed, e)),
        }
    }
}

/// The gateway's copy of the bucket: host → domain, current through a watch.
#[derive(Clone, Default)]
pub struct VerifiedHosts {
    held: Arc<RwLock<HashMap<String, Uuid>>>,
}

impl VerifiedHosts {
    /// Reads every host of `store`, then keeps the copy current until `shutdown`. The watch
    /// starts before the reading, and each (again after a pause when one ends) replays every
    /// host's last change, its removal among them: no change is missed in between.
    pub async fn watch(store: kv::Store, shutdown: CancellationToken) -> anyhow::Result<Self> {
        let hosts = Self::default();
        let first = store.watch_with_history(">").await?;
        let mut keys = store.keys().await?;
        while let Some(key) = keys.next().await {
            let key = key?;
            if let Some(value) = store.get(key.as_str()).await? {
                hosts.apply(key, Operation::Put, &value);
            }
        }
        let copy = hosts.clone();
        tokio::spawn(async move {
            let mut watch = Ok(first);
            loop {
                match watch {
                    Ok(mut entries) => loop {
                        let entry = tokio::select! {
                            _ = shutdown.cancelled() => return,
                            entry = entries.next() => entry,
                        };
                        match entry {
                            Some(Ok(e)) => copy.apply(e.key, e.operation, &e.value),
                            Some(Err(e)) => {
                                tracing::warn!(error = %e, "tracking hosts' watch failed");
                                break;
                            }
                            None => break,
                        }
                    },
                    Err(e) => tracing::warn!(error = %e, "tracking hosts not watched"),
                }
                tokio::select! {
                    _ = shutdown.cancelled() => return,
                    _ = tokio::time::sleep(Duration::from_secs(1)) => {}
                }
                watch = store.watch_with_history(">").await;
            }
        });
        Ok(hosts)
    }

    /// Applies one change of the bucket: `host` held by the domain `value` names, or by none.
    pub fn apply(&self, host: String, op: Operation, value: &[u8]) {
        let mut held = self.held.write().unwrap_or_else(|e| e.into_inner());
        match (op, Uuid::from_slice(value)) {
            (Operation::Put, Ok(domain)) => held.insert(host, domain),
            _ => held.remove(&host),
        };
    }

    /// The domain that holds `host` (a host as asked: any case, a port or a final dot).
    pub fn domain(&self, host: &str) -> Option<Uuid> {
        let held = self.held.read().unwrap_or_else(|e| e.into_inner());
        held.get(&canonical_host(host)).copied()
    }
}
