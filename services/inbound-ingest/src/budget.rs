//! Each workspace's inbound byte budget: a message spends its size in the budget of every
//! workspace it is addressed to, `bytes_per_sec` on average and up to `burst_bytes` at once
//! (GCRA on the database's clock, so every replica shares it). Past it the MTA is answered
//! 429 with `Retry-After` and keeps the message for later, as it does for any temporary
//! failure: one workspace's flood of mail neither fills the database nor takes the CPU that
//! every other workspace's mail and requests need.

use sqlx::PgPool;

use postmesh_shared::{ApiError, WorkspaceId};

use crate::settings::{INBOUND_WORKSPACE_BURST_BYTES, INBOUND_WORKSPACE_BYTES_PER_SEC};

/// The budget's settings; `bytes_per_sec == 0` turns it off.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ByteBudget {
    /// `INBOUND_WORKSPACE_BYTES_PER_SEC`, default 2 MiB.
    pub bytes_per_sec: u64,
    /// `INBOUND_WORKSPACE_BURST_BYTES`, default 32 MiB.
    pub burst_bytes: u64,
}

impl Default for ByteBudget {
    /// 2 MiB a second (over 170 GB a day), 32 MiB at once (three of the largest messages).
    fn default() -> Self {
        Self {
            bytes_per_sec: INBOUND_WORKSPACE_BYTES_PER_SEC.default_of(),
            burst_bytes: INBOUND_WORKSPACE_BURST_BYTES.default_of(),
        }
    }
}

impl ByteBudget {
    /// Reads the settings from the environment.
    pub fn from_env() -> anyhow::Result<Self> {
        Ok(Self {
            bytes_per_sec: INBOUND_WORKSPACE_BYTES_PER_SEC.parse()?,
            burst_bytes: INBOUND_WORKSPACE_BURST_BYTES.parse()?,
        })
    }

    /// The settings as environment variables.
    pub fn to_env(self) -> [(&'static str, String); 2] {
        [
            (
                INBOUND_WORKSPACE_BYTES_PER_SEC.name,
                self.bytes_per_sec.to_string(),
            ),
            (
                INBOUND_WORKSPACE_BURST_BYTES.name,
                self.burst_bytes.to_string(),
            ),
        ]
    }

    /// Spends `bytes` in the budget of each of `workspaces` once for each time it is named
    /// (each inbox of it stores a copy), all or none: 429 with the seconds until every one
    /// of them has room when one has not. A spend larger than the burst costs the whole
    /// burst, so every message the size limit takes can pass.
    pub async fn spend(
        self, db: &PgPool, workspaces: &[WorkspaceId], bytes: usize,
    ) -> Result<(), ApiError> {
        if self.bytes_per_sec == 0 || workspaces.is_empty() {
            return Ok(());
        }
        let mut copies: std::collections::BTreeMap<uuid::Uuid, u64> = Default::default();
        for w in workspaces {
            *copies.entry(w.as_uuid()).or_default() += 1;
        }
        let ids: Vec<_> = copies.keys().copied().collect();
        let rate = self.bytes_per_sec as f64;
        let tolerance = self.burst_bytes as f64 / rate;
        let cost = |workspace: &uuid::Uuid| {
            let spent = (bytes as u64).saturating_mul(copies[workspace]);
            spent.min(self.burst_bytes) as f64 / rate
        };
        let mut tx = db.begin().await?;
        // Rows in id order, so two messages to the same workspaces never wait on each other.
        sqlx::query(
            "INSERT INTO inbound_budget (workspace_id, tat)
             SELECT unnest($1::uuid[]), 0 ON CONFLICT DO NOTHING",
        )
        .bind(&ids)
        .execute(&mut *tx)
        .await?;
        let rows: Vec<(uuid::Uuid, f64, f64)> = sqlx::query_as(
            "SELECT workspace_id, tat, extract(epoch FROM clock_timestamp())::float8
             FROM inbound_budget WHERE workspace_id = ANY($1)
             ORDER BY workspace_id FOR UPDATE",
        )
        .bind(&ids)
        .fetch_all(&mut *tx)
        .await?;
        let mut wait: f64 = 0.0;
        let mut tats = Vec::with_capacity(rows.len());
        for (workspace, tat, now) in &rows {
            let tat = tat.max(*now) + cost(workspace);
            wait = wait.max(tat - tolerance - now);
            tats.push(tat);
        }
        if wait > 0.0 {
            return Err(ApiError::TooManyRequests {
                message: format!(
                    "the workspace has received over {} bytes a second of mail: retry later",
                    self.bytes_per_sec
                ),
                retry_after: (wait.ceil() as u64).max(1),
            });
        }
        let ids: Vec<_> = rows.iter().map(|(id, ..)| *id).collect();
        sqlx::query(
            "UPDATE inbound_budget b SET tat = n.tat
             FROM unnest($1::uuid[], $2::float8[]) AS n(workspace_id, tat)
             WHERE b.workspace_id = n.workspace_id",
        )
        .bind(&ids)
        .bind(&tats)
        .execute(&mut *tx)
        .await?;
        tx.commit().await?;
        Ok(())
    }
}
