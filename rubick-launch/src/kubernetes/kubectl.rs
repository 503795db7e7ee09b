//! kubectl: every call with the settings' context and namespace, and what it says of a
//! run (its resource's conditions, its pods).

use std::process::{Command, Stdio};

use anyhow::Context as _;

use super::settings::{Kubernetes, TrainingKind};

impl Kubernetes {
    /// kubectl's arguments with the settings' context and namespace first.
    pub(crate) fn kubectl_args<'a>(&'a self, args: &[&'a str]) -> Vec<&'a str> {
        let mut all: Vec<&str> = Vec::with_capacity(args.len() + 4);
        if let Some(c) = &self.context {
            all.extend(["--context", c]);
        }
        if let Some(n) = &self.namespace {
            all.extend(["--namespace", n]);
        }
        all.extend(args);
        all
    }

    /// kubectl with the settings' context and namespace.
    pub(crate) fn kubectl(&self, args: &[&str]) -> anyhow::Result<String> {
        kubectl(&self.kubectl_args(args))
    }

    /// Fails with what to do when kubectl has no context to apply to.
    pub(crate) fn ensure_context(&self) -> anyhow::Result<()> {
        if self.context.is_some() {
            return Ok(());
        }
        kubectl(&["config", "current-context"]).map(drop).map_err(|e| {
            anyhow::anyhow!(
                "kubectl mode, but kubectl has no current context ({e}): set one (`kubectl config use-context`), \
                 name one (`context:` in the settings of `apply --kubernetes FILE`), or write manifests for GitOps \
                 (`kubectl: false`)"
            )
        })
    }
}

/// Runs `kubectl ARGS`; its stdout, or an error with its stderr.
fn kubectl(args: &[&str]) -> anyhow::Result<String> {
    let out = Command::new("kubectl").args(args).stdin(Stdio::null()).output().context("kubectl: cannot run it")?;
    anyhow::ensure!(
        out.status.success(),
        "kubectl {}: {}",
        args.join(" "),
        String::from_utf8_lossy(&out.stderr).trim()
    );
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

/// `(exists, true conditions)` of a training resource.
pub(crate) fn resource_conditions(
    k: &Kubernetes,
    kind: TrainingKind,
    name: &str,
) -> anyhow::Result<Option<Vec<String>>> {
    let path = r#"jsonpath={.metadata.name}{range .status.conditions[?(@.status=="True")]} {.type}{end}"#;
    let out = k.kubectl(&["get", kind.resource(), name, "--ignore-not-found", "-o", path])?;
    let mut words = out.split_whitespace();
    Ok(words.next().map(|_| words.map(str::to_owned).collect()))
}

/// The exit code a resource's conditions say: 1 after `Failed`, 0 after `Succeeded`
/// or `Complete`; none while it has neither.
pub(crate) fn terminal(conditions: &[String]) -> Option<i32> {
    if conditions.iter().any(|c| c == "Failed") {
        Some(1)
    } else if conditions.iter().any(|c| c == "Succeeded" || c == "Complete") {
        Some(0)
    } else {
        None
    }
}

impl Kubernetes {
    /// Whether any pod of the run is pending or running (deleting the resource leaves
    /// its pods terminating for their grace period).
    pub(crate) fn pods_left(&self, kind: TrainingKind, name: &str) -> anyhow::Result<bool> {
        let pods = self.kubectl(&[
            "get",
            "pods",
            "-l",
            &kind.pod_selector(name),
            "--field-selector=status.phase!=Succeeded,status.phase!=Failed",
            "-o",
            "name",
        ])?;
        Ok(!pods.trim().is_empty())
    }
}
