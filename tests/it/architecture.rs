//! ARCHITECTURE.md's crate graph (its ```` ```crates ```` block) is the workspace's:
//! every member's normal dependencies on other members, as `cargo metadata --no-deps`
//! reads them from the manifests (an optional one with the features that enable it, in
//! brackets). The test fails when either side changes alone.

use std::collections::{BTreeMap, BTreeSet};
use std::process::Command;

use rubick_tests::repo;

/// Each crate with its dependencies on other members.
type Graph = BTreeMap<String, BTreeSet<String>>;

/// The graph of ARCHITECTURE.md's `crates` block: one `crate -> dep, dep` line per
/// member, `#` starting a comment.
fn documented(text: &str) -> Graph {
    let block = text
        .split("```crates\n")
        .nth(1)
        .and_then(|rest| rest.split("\n```").next())
        .expect("ARCHITECTURE.md has a ```crates block");
    block
        .lines()
        .map(|line| line.split('#').next().unwrap_or_default().trim())
        .filter(|line| !line.is_empty())
        .map(|line| {
            let (name, deps) = line.split_once("->").unwrap_or_else(|| panic!("`{line}`: not `crate -> deps`"));
            let deps = deps.split(',').map(str::trim).filter(|d| !d.is_empty()).map(String::from).collect();
            (name.trim().to_owned(), deps)
        })
        .collect()
}

/// The graph of the manifests, from `cargo metadata --format-version 1 --no-deps`.
fn actual() -> Graph {
    let cargo = std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into());
    let out = Command::new(cargo)
        .args(["metadata", "--format-version", "1", "--no-deps", "--offline"])
        .current_dir(repo())
        .output()
        .expect("cargo metadata runs");
    assert!(out.status.success(), "cargo metadata: {}", String::from_utf8_lossy(&out.stderr));
    let meta: serde_json::Value = serde_json::from_slice(&out.stdout).expect("cargo metadata's JSON");
    let packages = meta["packages"].as_array().expect("packages");
    let members: BTreeSet<&str> = packages.iter().filter_map(|p| p["name"].as_str()).collect();
    packages
        .iter()
        .map(|p| {
            let deps = p["dependencies"]
                .as_array()
                .expect("dependencies")
                .iter()
                .filter(|d| d["kind"].is_null())
                .filter_map(|d| {
                    let name = d["name"].as_str()?;
                    members.contains(name).then_some(())?;
                    if d["optional"] != serde_json::Value::Bool(true) {
                        return Some(name.to_owned());
                    }
                    let features: Vec<&str> = p["features"]
                        .as_object()
                        .expect("features")
                        .iter()
                        .filter(|(_, enables)| {
                            enables.as_array().is_some_and(|e| e.iter().any(|x| x == &format!("dep:{name}")))
                        })
                        .map(|(feature, _)| feature.as_str())
                        .collect();
                    Some(format!("{name} [{}]", features.join(" ")))
                })
                .collect();
            (p["name"].as_str().expect("name").to_owned(), deps)
        })
        .collect()
}

fn render(graph: &Graph) -> String {
    graph
        .iter()
        .map(|(name, deps)| format!("{name} -> {}\n", deps.iter().cloned().collect::<Vec<_>>().join(", ")))
        .collect()
}

#[test]
fn the_documented_crate_graph_is_the_manifests() {
    let text = std::fs::read_to_string(repo().join("ARCHITECTURE.md")).expect("ARCHITECTURE.md");
    let (documented, actual) = (documented(&text), actual());
    assert_eq!(
        render(&documented),
        render(&actual),
        "ARCHITECTURE.md's `crates` block (left) is not what the manifests say (right)"
    );
}

#[test]
fn the_parser_reads_comments_and_empty_dependencies() {
    let text = "x\n```crates\n# a comment\na ->          # a leaf\nb -> a, c [f]\n```\n";
    let graph = documented(text);
    assert_eq!(render(&graph), "a -> \nb -> a, c [f]\n");
}
