//! The stack's services as processes: stopped, started again, killed.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::Stdio;
use std::time::Duration;

use postmesh_shared::{Running, Service};

use super::Stack;
use crate::settings::{dispatcher_config, gateway_config, inbound_config, SenderMode};
use crate::wait::eventually;

impl Stack {
    /// Stops billing (gracefully): its RPCs and routes get no answer until it starts again.
    pub async fn stop_billing(&mut self) {
        if let Some(running) = self.billing.take() {
            running.stop().await;
        }
    }

    /// Stops the domain service (gracefully): its RPCs and routes get no answer.
    pub async fn stop_domain(&mut self) {
        if let Some(running) = self.domain.take() {
            running.stop().await;
        }
    }

    /// Billing and a second gateway as child processes with this stack's settings (the
    /// bench's `/balance`, measuring each process): billing's process, the gateway's, and
    /// the gateway's base URL. Stop the in-process billing first, or it shares the requests.
    pub async fn spawn_gateway_and_billing(
        &mut self,
    ) -> (tokio::process::Child, tokio::process::Child, String) {
        let mut billing = self.billing_config.clone();
        billing.common.admin_addr = free_port();
        let billing_child = spawn_service(billing::SERVICE, billing.to_env());
        self.wait_ready(billing.common.admin_addr, &billing_child)
            .await;
        let (gateway_child, base) = self.spawn_gateway().await;
        (billing_child, gateway_child, base)
    }

    /// A second gateway as a child process with this stack's settings: its process and its
    /// base URL.
    pub async fn spawn_gateway(&self) -> (tokio::process::Child, String) {
        let mut gateway = self.gateway_config.clone();
        gateway.common.admin_addr = free_port();
        gateway.http_addr = free_port();
        let child = spawn_service(api_gateway::SERVICE, gateway.to_env());
        self.wait_ready(gateway.common.admin_addr, &child).await;
        (child, format!("http://{}", gateway.http_addr))
    }

    /// The sender and inbound-ingest as child processes with this stack's settings, in
    /// place of the in-process ones (the bench's hostile load: the services its corpus
    /// reaches share no runtime with the clients that measure). Returns their processes;
    /// [`Stack::start_sender_and_inbound`] brings the in-process ones back.
    pub async fn spawn_sender_and_inbound(
        &mut self,
    ) -> (tokio::process::Child, tokio::process::Child) {
        self.kill_sender().await;
        if let Some(running) = self.inbound.take() {
            running.stop().await;
        }
        let mut sender = self.sender_config();
        sender.common.admin_addr = free_port();
        let sender_child = spawn_service(sender::SERVICE, sender.to_env());
        self.wait_ready(sender.common.admin_addr, &sender_child)
            .await;
        let mut inbound = self.inbound_config();
        inbound.common.admin_addr = free_port();
        let inbound_child = spawn_service(inbound_ingest::SERVICE, inbound.to_env());
        self.wait_ready(inbound.common.admin_addr, &inbound_child)
            .await;
        (sender_child, inbound_child)
    }

    /// Inbound-ingest's settings in this stack.
    fn inbound_config(&self) -> inbound_ingest::Config {
        inbound_ingest::Config {
            budget: self.inbound_budget,
            ..inbound_config(&self.common)
        }
    }

    /// Starts the sender and inbound-ingest in process again.
    pub async fn start_sender_and_inbound(&mut self) {
        self.start_sender().await;
        let running = inbound_ingest::start(self.inbound_config())
            .await
            .expect("inbound service starts");
        self.inbound = Some(running);
    }

    /// Starts billing again with the settings it had.
    pub async fn start_billing(&mut self) {
        let running = billing::start(self.billing_config.clone())
            .await
            .expect("billing starts");
        self.billing = Some(running);
    }

    /// Starts the sender (again).
    pub async fn start_sender(&mut self) {
        let mut config = self.sender_config();
        match self.mode {
            SenderMode::InProcess => {
                let running = sender::start(config).await.expect("sender starts");
                self.sender = Some(running);
            }
            SenderMode::ChildProcess => {
                // The same settings as in process, through the environment.
                let admin = free_port();
                config.common.admin_addr = admin;
                let child = spawn_service(sender::SERVICE, config.to_env());
                self.wait_ready(admin, &child).await;
                self.sender_child = Some(child);
            }
        }
    }

    /// Waits until `child`'s admin server at `addr` reports ready: an answer from another
    /// process that took the port first (it was free a moment before) does not count.
    pub async fn wait_ready(&self, addr: SocketAddr, child: &tokio::process::Child) {
        let pid = child.id().expect("the child runs").to_string();
        let pid = pid.as_str();
        eventually(Duration::from_secs(30), || async move {
            let ready = self.http.get(format!("http://{addr}/readyz")).send().await;
            let (status, from) = match ready {
                Ok(r) => {
                    let from = r
                        .headers()
                        .get(postmesh_shared::telemetry::PROCESS_ID)
                        .cloned();
                    (r.status(), from)
                }
                Err(e) => return Err(format!("service at {addr} not ready: {e}")),
            };
            match from {
                Some(from) if from == pid && status.is_success() => Ok(()),
                Some(from) if from != pid => {
                    Err(format!("{addr} is process {from:?}'s, not {pid}"))
                }
                _ => Err(format!("service at {addr} not ready: {status}")),
            }
        })
        .await
    }

    /// Another gateway replica on this stack's namespace, with the test settings as `tune`
    /// leaves them, and its base URL; stop it with `Running::stop`.
    pub async fn another_gateway(
        &self, tune: impl FnOnce(&mut api_gateway::Config),
    ) -> (Running, String) {
        let mut config = gateway_config(&self.common, self.gateway_config.rate);
        tune(&mut config);
        let running = api_gateway::start(config).await.expect("another gateway");
        let base = format!("http://{}", running.http_addr.expect("it listens"));
        (running, base)
    }

    /// Another gateway that refuses an address after five failed authentications a minute,
    /// once at least ten seconds of the minute are left (the count starts afresh with each).
    pub async fn five_failures_a_minute(&self) -> (Running, String) {
        let (gateway, base) = self
            .another_gateway(|c| c.auth_failures_per_ip_per_minute = 5)
            .await;
        let second = postmesh_shared::db::now_unix() % 60;
        if second > 50 {
            tokio::time::sleep(Duration::from_secs(61 - second as u64)).await;
        }
        (gateway, base)
    }

    /// The webhook dispatcher's settings in this stack.
    pub fn dispatcher_config(&self) -> webhook_dispatcher::Config {
        dispatcher_config(&self.common)
    }

    /// Stops the webhook dispatcher: gracefully in process, with SIGKILL as a child process.
    pub async fn kill_dispatcher(&mut self) {
        if let Some(running) = self.dispatcher.take() {
            running.stop().await;
        }
        if let Some(mut child) = self.dispatcher_child.take() {
            child.kill().await.expect("dispatcher killed");
        }
    }

    /// Restarts the webhook dispatcher in process with `config`.
    pub async fn restart_dispatcher(&mut self, config: webhook_dispatcher::Config) {
        self.kill_dispatcher().await;
        let running = webhook_dispatcher::start(config)
            .await
            .expect("webhook dispatcher starts");
        self.dispatcher = Some(running);
    }

    /// Restarts the webhook dispatcher as a child process with `config` (to be killed).
    pub async fn spawn_dispatcher(&mut self, mut config: webhook_dispatcher::Config) {
        self.kill_dispatcher().await;
        let admin = free_port();
        config.common.admin_addr = admin;
        let child = spawn_service(webhook_dispatcher::SERVICE, config.to_env());
        self.wait_ready(admin, &child).await;
        self.dispatcher_child = Some(child);
    }

    /// The webhook dispatcher's process id, when it runs as a child process.
    pub fn dispatcher_pid(&self) -> Option<u32> {
        self.dispatcher_child
            .as_ref()
            .and_then(tokio::process::Child::id)
    }

    /// Stops the sender: gracefully in process, with SIGKILL as a child process.
    pub async fn kill_sender(&mut self) {
        if let Some(running) = self.sender.take() {
            running.stop().await;
        }
        if let Some(mut child) = self.sender_child.take() {
            child.kill().await.expect("sender killed");
        }
    }
}

/// Starts `service`'s binary as a child process with only `env` (and `RUST_LOG=warn` unless
/// `env` sets it; killed when dropped).
pub fn spawn_service(service: Service, env: Vec<(&'static str, String)>) -> tokio::process::Child {
    spawn_service_to(service, env, Stdio::null())
}

/// [`spawn_service`] with the service's log lines (its stdout) going to `log`.
pub fn spawn_service_to(
    service: Service, env: Vec<(&'static str, String)>, log: impl Into<Stdio>,
) -> tokio::process::Child {
    tokio::process::Command::new(workspace_binary(service.name()))
        .env_clear()
        .env("RUST_LOG", "warn")
        .envs(env)
        .current_dir(concat!(env!("CARGO_MANIFEST_DIR"), "/.."))
        .stdout(log)
        .kill_on_drop(true)
        .spawn()
        .expect("service binary runs (build the workspace first)")
}

/// A local port that was free a moment ago.
pub fn free_port() -> SocketAddr {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
    listener.local_addr().expect("addr")
}

/// A binary built by this workspace in the profile of the running executable: a test
/// (`target/<profile>/deps/<test>`) or a binary such as the bench (`target/<profile>/bench`).
pub fn workspace_binary(name: &str) -> PathBuf {
    let exe = std::env::current_exe().expect("executable path");
    let mut dir = exe.parent().expect("target dir");
    if dir.ends_with("deps") {
        dir = dir.parent().expect("profile dir");
    }
    dir.join(name)
}
