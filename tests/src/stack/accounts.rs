//! Accounts, keys, codes and balances of a test stack, through its API.

use std::time::Duration;

use reqwest::{Method, StatusCode};

use api_gateway::create_key::CreateKey;
use postmesh_contracts::answers::gateway::KeyMode;
use postmesh_shared::proto::Role;

use super::Stack;
use crate::{peek, Answer, TestClient};

impl Stack {
    /// The workspace of `key`.
    pub async fn workspace_of(&self, key: &str) -> uuid::Uuid {
        let db = self.service_db(api_gateway::SERVICE).await;
        peek::gateway::workspace_of(&db, self.key_id(key).await).await
    }

    /// The email address of the account that owns `key`.
    pub async fn account_email(&self, key: &str) -> String {
        sqlx::query_scalar(
            "SELECT a.email FROM accounts a JOIN api_keys k ON k.account_id = a.id WHERE k.id = $1",
        )
        .bind(self.key_id(key).await)
        .fetch_one(&self.service_db(api_gateway::SERVICE).await)
        .await
        .expect("account row")
    }

    /// Creates an account with a fresh address and a key holding `credits`.
    pub async fn key(&self, credits: i64) -> String {
        self.key_with_role(credits, Role::Member).await
    }

    /// Creates an account with a fresh address and an admin key.
    pub async fn admin_key(&self) -> String {
        self.key_with_role(0, Role::Admin).await
    }

    async fn key_with_role(&self, credits: i64, role: Role) -> String {
        let email = format!("dev-{}@example.com", uuid::Uuid::new_v4().simple());
        let email = postmesh_shared::EmailAddress::parse(&email).expect("address");
        CreateKey {
            email,
            credits,
            role,
            mode: KeyMode::Live,
        }
        .create(&self.common)
        .await
        .expect("key created")
    }

    /// A test key of the account `key` belongs to (`api-gateway create-key --mode test`).
    pub async fn test_key_of(&self, key: &str) -> String {
        let email = self.account_email(key).await;
        CreateKey {
            email: postmesh_shared::EmailAddress::parse(&email).expect("address"),
            credits: 0,
            role: Role::Member,
            mode: KeyMode::Test,
        }
        .create(&self.common)
        .await
        .expect("test key created")
    }

    /// A client of the gateway without a key.
    pub fn anonymous(&self) -> TestClient {
        TestClient::http(&self.base, None)
    }

    /// `POST /send-code` with `key`; the whole answer.
    pub async fn send_code(&self, key: &str, email: impl serde::Serialize) -> Answer {
        self.client(key)
            .request(
                Method::POST,
                "/send-code",
                &serde_json::json!({ "email": email }),
            )
            .await
    }

    /// `POST /send-code` with `key`, which must succeed.
    pub async fn send_code_ok(&self, key: &str, email: &str) {
        let sent: postmesh_shared::Success<postmesh_shared::response::Message> = self
            .send_code(key, email)
            .await
            .expect(StatusCode::OK, &format!("send-code to {email}"));
        assert!(sent.success);
    }

    /// `POST /verify-code` with `key`, which must succeed.
    pub async fn verify_ok(&self, key: &str, email: &str, code: &str) {
        let checked: postmesh_shared::Success<postmesh_shared::response::Message> = self
            .verify(key, email, code)
            .await
            .expect(StatusCode::OK, &format!("verify-code for {email}"));
        assert!(checked.success);
    }

    /// The first page of the key's consumption log, newest first.
    pub async fn logs(&self, key: &str) -> Vec<billing::logs::LogEntry> {
        let page: postmesh_shared::Success<billing::logs::LogPage> =
            self.client(key).get("/logs", StatusCode::OK).await;
        page.body.logs
    }

    /// `POST /verify-code` with `key`; the whole answer.
    pub async fn verify(
        &self, key: &str, email: impl serde::Serialize, code: impl serde::Serialize,
    ) -> Answer {
        let body = serde_json::json!({ "email": email, "code": code });
        self.client(key)
            .request(Method::POST, "/verify-code", &body)
            .await
    }

    /// The key's balance, read through the API.
    pub async fn balance(&self, key: &str) -> i64 {
        self.client(key)
            .get::<postmesh_shared::Success<billing::balance::Balance>>("/balance", StatusCode::OK)
            .await
            .body
            .balance
    }

    /// The key's balance once the sender owes billing nothing, so that no settlement can
    /// still change it.
    pub async fn settled_balance(&self, key: &str) -> i64 {
        let db = self.sender_db().await;
        crate::eventually(Duration::from_secs(30), || async {
            match peek::sender::unsettled(&db).await {
                0 => Ok(()),
                n => Err(format!("{n} settlements not done")),
            }
        })
        .await;
        self.balance(key).await
    }

    /// The balance of `key`, or what the gateway answered instead (a 503 while billing
    /// comes back): for probes that wait on a service being restarted.
    pub async fn try_balance(&self, key: &str) -> Result<i64, String> {
        let answer = self
            .client(key)
            .send(reqwest::Method::GET, "/balance", None)
            .await;
        if answer.status != StatusCode::OK {
            return Err(format!(
                "{}: {}",
                answer.status,
                String::from_utf8_lossy(&answer.body)
            ));
        }
        let body: postmesh_shared::Success<billing::balance::Balance> =
            serde_json::from_slice(&answer.body).map_err(|e| e.to_string())?;
        Ok(body.body.balance)
    }
}
