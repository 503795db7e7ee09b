//! The Kubernetes backend: manifests for a GitOps tool, checked against
//! Kubernetes' schemas where the validator is installed; its settings file, kept in
//! the state.

use std::process::Command;

use rubick_tests::{Reaper, binary, temp, venv};

use super::{ok, schedule, setup, state};

#[test]
fn the_kubernetes_backend_writes_manifests_a_gitops_tool_applies() {
    let dir = temp();
    let _reaper = Reaper(dir.path().to_path_buf());
    let d = dir.path();
    setup(d, 100);
    ok(d, &["submit", "a.yaml"]);
    let gitops = d.join("gitops");
    let k8s = |args: &[&str]| {
        let out = Command::new(binary("rubick-run"))
            .args(args)
            .arg("--state")
            .arg(d.join("state"))
            .current_dir(d)
            .env("RUBICK_KUBECTL", "0")
            .env("RUBICK_K8S_MANIFEST_DIR", &gitops)
            .output()
            .unwrap();
        assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    };
    let listed = || {
        let mut names: Vec<String> = std::fs::read_dir(&gitops)
            .map(|r| r.filter_map(|e| Some(e.ok()?.file_name().to_str()?.to_owned())).collect())
            .unwrap_or_default();
        names.sort();
        names
    };
    schedule(d, "r1.yaml", 1, &[("a", "dp1-tp1-pp1-mb4-ga4", &[0])]);
    k8s(&["apply", "r1.yaml", "--backend", "kubernetes"]);
    assert_eq!(listed(), ["rubick-a-1.yaml"]);
    let manifest = std::fs::read_to_string(gitops.join("rubick-a-1.yaml")).unwrap();
    // The core kind against Kubernetes' published schemas (the CRDs are checked against
    // theirs in the backend's unit tests).
    // (kubernetes-validate is in the PyTorch workload's virtual environment.)
    if let Some(venv) = venv() {
        let validator = venv.join("bin/kubernetes-validate");
        let out = Command::new(&validator).arg("--strict").arg(gitops.join("rubick-a-1.yaml")).output().unwrap();
        let said = String::from_utf8_lossy(&out.stderr).into_owned() + &String::from_utf8_lossy(&out.stdout);
        assert!(out.status.success() && said.contains("passed for resource configmap/rubick-a-1"), "{said}");
    }
    assert!(
        manifest.contains("kind: PyTorchJob")
            && manifest.contains("kind: TrainJob")
            && manifest.contains("kind: ConfigMap")
    );
    // Idempotent; then a reconfiguration replaces the resources; a stop removes them.
    k8s(&["apply", "r1.yaml", "--backend", "kubernetes"]);
    assert_eq!(listed(), ["rubick-a-1.yaml"]);
    schedule(d, "r2.yaml", 2, &[("a", "dp2-tp1-pp1-mb4-ga2", &[0, 1])]);
    k8s(&["apply", "r2.yaml", "--backend", "kubernetes"]);
    assert_eq!(listed(), ["rubick-a-2.yaml"]);
    k8s(&["stop", "a"]);
    assert!(listed().is_empty(), "{:?}", listed());
}

/// Regression, "Kubernetes settings exist only as undocumented environment variables ...
/// without a kubectl context the status says running": `apply --kubernetes FILE` takes
/// the settings (kept in the state for every later command); in kubectl mode without a
/// context, the start fails saying what to do, and the job is not reported running.
#[test]
fn kubernetes_settings_are_a_file_kept_in_the_state() {
    let dir = temp();
    let _reaper = Reaper(dir.path().to_path_buf());
    let d = dir.path();
    setup(d, 100);
    ok(d, &["submit", "a.yaml", "b.yaml"]);
    let gitops = d.join("gitops");
    std::fs::write(
        d.join("k8s.yaml"),
        format!("image: registry.example/train:1\nkubectl: false\nmanifestDir: {}\n", gitops.display()),
    )
    .unwrap();
    let k8s = |args: &[&str], path: &str| {
        let out = Command::new(binary("rubick-run"))
            .args(args)
            .arg("--state")
            .arg(d.join("state"))
            .current_dir(d)
            .env("PATH", path)
            .env_remove("RUBICK_KUBECTL")
            .env_remove("RUBICK_K8S_MANIFEST_DIR")
            .output()
            .unwrap();
        (out.status.code(), String::from_utf8_lossy(&out.stderr).into_owned())
    };
    let path = std::env::var("PATH").unwrap_or_default();
    schedule(d, "r1.yaml", 1, &[("a", "dp1-tp1-pp1-mb4-ga4", &[0])]);
    let (code, err) = k8s(&["apply", "r1.yaml", "--backend", "kubernetes", "--kubernetes", "k8s.yaml"], &path);
    assert_eq!(code, Some(0), "{err}");
    let manifest = std::fs::read_to_string(gitops.join("rubick-a-1.yaml")).unwrap();
    assert!(manifest.contains("image: registry.example/train:1"), "{manifest}");
    assert!(d.join("state/kubernetes.yaml").exists(), "kept for later commands");
    // A bad settings file names its field.
    std::fs::write(d.join("bad.yaml"), "kind: CronJob\n").unwrap();
    let (code, err) = k8s(&["apply", "r1.yaml", "--backend", "kubernetes", "--kubernetes", "bad.yaml"], &path);
    assert_eq!(code, Some(2), "{err}");
    assert!(err.contains("kind") && err.contains("CronJob"), "{err}");
    // kubectl mode with a kubectl that has no context: b's start fails with what to do.
    let bin = d.join("bin");
    std::fs::create_dir_all(&bin).unwrap();
    std::fs::write(bin.join("kubectl"), "#!/bin/sh\necho 'error: current-context is not set' >&2\nexit 1\n").unwrap();
    std::fs::set_permissions(bin.join("kubectl"), std::os::unix::fs::PermissionsExt::from_mode(0o755)).unwrap();
    std::fs::write(d.join("k8s.yaml"), "kubectl: true\n").unwrap();
    schedule(d, "r2.yaml", 2, &[("a", "dp1-tp1-pp1-mb4-ga4", &[0]), ("b", "dp1-tp1-pp1-mb4-ga4", &[1])]);
    let path = format!("{}:{path}", bin.display());
    let (code, err) = k8s(&["apply", "r2.yaml", "--backend", "kubernetes", "--kubernetes", "k8s.yaml"], &path);
    assert_eq!(code, Some(1), "{err}");
    assert!(err.contains("no current context") && err.contains("use-context"), "{err}");
    assert_eq!(state(d)["jobs"]["b"]["status"].as_str(), Some("failed"), "not reported running");
}
