//! Whose deliveries a route is about: an inbox endpoint's or a workspace webhook's. Below
//! the delivery stages (`deliver`) and the attempts' routes (`attempts`), which both use it.

use sqlx::postgres::PgRow;
use sqlx::PgPool;
use uuid::Uuid;

use postmesh_shared::extract::Caller;
use postmesh_shared::ApiError;

/// Whose deliveries a route is about.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Owner {
    /// An inbox endpoint's (`/inbox/webhook/endpoints/{id}/...`).
    Endpoint,
    /// A workspace webhook's (`/webhooks/{id}/...`).
    Webhook,
}

impl Owner {
    /// Its table, and the attempts' column naming it.
    pub(crate) fn table(self) -> (&'static str, &'static str) {
        match self {
            Self::Endpoint => ("endpoints", "endpoint_id"),
            Self::Webhook => ("webhooks", "webhook_id"),
        }
    }

    /// The 404 of one that does not exist.
    pub(crate) fn not_found(self) -> ApiError {
        ApiError::NotFound(match self {
            Self::Endpoint => "no such endpoint".into(),
            Self::Webhook => "no such webhook".into(),
        })
    }

    /// The caller's endpoint or webhook `id` as `columns` of its row, or the 404.
    pub(crate) async fn find<T>(
        self, db: &PgPool, columns: &str, caller: &Caller, id: Uuid,
    ) -> Result<T, ApiError>
    where
        T: for<'r> sqlx::FromRow<'r, PgRow> + Send + Unpin,
    {
        let (table, _) = self.table();
        sqlx::query_as(&format!(
            "SELECT {columns} FROM {table} WHERE id = $1 AND workspace_id = $2"
        ))
        .bind(id)
        .bind(caller.workspace)
        .fetch_optional(db)
        .await?
        .ok_or_else(|| self.not_found())
    }

    /// Deletes the caller's endpoint or webhook `id` with its attempts (which carry no
    /// foreign key: see migration 0005), or the 404.
    pub(crate) async fn remove(
        self, db: &PgPool, caller: &Caller, id: Uuid,
    ) -> Result<(), ApiError> {
        let (table, column) = self.table();
        let mut tx = db.begin().await?;
        let done = sqlx::query(&format!(
            "DELETE FROM {table} WHERE id = $1 AND workspace_id = $2"
        ))
        .bind(id)
        .bind(caller.workspace)
        .execute(&mut *tx)
        .await?;
        if done.rows_affected() == 0 {
            return Err(self.not_found());
        }
        sqlx::query(&format!("DELETE FROM attempts WHERE {column} = $1"))
            .bind(id)
            .execute(&mut *tx)
            .await?;
        tx.commit().await?;
        Ok(())
    }
}
