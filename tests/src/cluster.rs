//! The checkout's `deploy/` scripts, run from a test binary: the local three-node NATS
//! cluster (`deploy/nats-cluster.sh`) and the dependency restarts (`deploy/restart-dep.sh`).

/// `deploy/<script> args`, run from the checkout's root.
pub fn deploy_script(script: &str, args: &[&str]) -> tokio::process::Command {
    let mut command = tokio::process::Command::new(format!("./deploy/{script}"));
    command
        .args(args)
        .current_dir(concat!(env!("CARGO_MANIFEST_DIR"), "/.."));
    command
}

/// Runs `deploy/nats-cluster.sh` with `args`; what it printed.
pub async fn nats_cluster(args: &[&str]) -> String {
    try_nats_cluster(args)
        .await
        .unwrap_or_else(|e| panic!("{e}"))
}

/// Runs `deploy/nats-cluster.sh` with `args`; what it printed, or why it failed.
pub async fn try_nats_cluster(args: &[&str]) -> Result<String, String> {
    let out = deploy_script("nats-cluster.sh", args)
        .output()
        .await
        .expect("nats-cluster.sh runs");
    if !out.status.success() {
        return Err(format!(
            "nats-cluster.sh {args:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        ));
    }
    Ok(String::from_utf8_lossy(&out.stdout).trim().to_owned())
}

/// Whether `deploy/nats-cluster.sh` can cut node 3 off (it runs in a namespace of its own).
pub async fn nats_cluster_can_partition() -> bool {
    deploy_script("nats-cluster.sh", &["can-partition"])
        .status()
        .await
        .is_ok_and(|s| s.success())
}

/// The local three-node NATS cluster, running until this is dropped — passed or failed, a
/// panic included — so the next run does not find its ports taken.
pub struct ClusterGuard {
    /// The `NATS_URL` listing every node.
    pub url: String,
}

impl ClusterGuard {
    /// Starts a cluster formed afresh (no node's data from an earlier run: a meta group
    /// stopped seconds after it formed sometimes elected no leader again) and waits until
    /// every node is current with the meta leader.
    pub async fn start() -> Self {
        // Made first, so a failed start stops what did start.
        let mut guard = Self { url: String::new() };
        nats_cluster(&["clean"]).await;
        nats_cluster(&["start"]).await;
        guard.url = nats_cluster(&["url"]).await;
        guard
    }
}

impl Drop for ClusterGuard {
    fn drop(&mut self) {
        let _ = deploy_script("nats-cluster.sh", &["stop"])
            .as_std_mut()
            .status();
    }
}
