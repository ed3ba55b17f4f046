//! The deploy files cannot rot: the Kubernetes manifests render with real kustomize (the one in
//! kubectl) and pass the Kubernetes schemas (kubernetes-validate, strict), and what they say
//! about clawback — ports, probes, the sidecar's config — matches what the code does.

use std::path::{Path, PathBuf};

use clawback_sidecar::config::{Config, Overrides};
use clawback_tests::deploy_tools::{run_tool, yaml_documents};
use clawback_tests::harness::{repo_root, scratch_dir};
use serde_json::Value;

/// The oldest Kubernetes with native sidecars on by default, and the newest the validator knows.
const KUBERNETES_VERSIONS: [&str; 2] = ["1.29.0", "1.37.0"];

fn k8s() -> PathBuf {
    repo_root().join("deploy/k8s")
}

/// The base and every overlay: each folder that holds a kustomization.yaml.
fn kustomizations() -> Vec<PathBuf> {
    let mut found = vec![k8s().join("base")];
    let overlays = std::fs::read_dir(k8s().join("overlays")).expect("deploy/k8s/overlays");
    let mut overlays: Vec<PathBuf> = overlays
        .filter_map(|entry| entry.ok().map(|e| e.path()))
        .filter(|dir| dir.join("kustomization.yaml").is_file())
        .collect();
    overlays.sort();
    assert!(!overlays.is_empty(), "no overlays in deploy/k8s/overlays");
    found.extend(overlays);
    found
}

fn render(kustomization: &Path) -> String {
    let dir = kustomization.to_string_lossy();
    run_tool("kubectl", &["kustomize", &dir]).unwrap_or_else(|e| panic!("{e}"))
}

fn rendered_base() -> Vec<Value> {
    yaml_documents(&render(&k8s().join("base")))
}

fn find<'a>(documents: &'a [Value], kind: &str, name: &str) -> &'a Value {
    documents
        .iter()
        .find(|d| d["kind"] == kind && d["metadata"]["name"] == name)
        .unwrap_or_else(|| panic!("no {kind} {name} in the rendered manifests"))
}

fn pod_spec<'a>(documents: &'a [Value], kind: &str, name: &str) -> &'a Value {
    &find(documents, kind, name)["spec"]["template"]["spec"]
}

fn named<'a>(list: &'a Value, name: &str) -> &'a Value {
    list.as_array()
        .and_then(|items| items.iter().find(|item| item["name"] == name))
        .unwrap_or_else(|| panic!("no entry named {name} in {list}"))
}

fn env_value<'a>(container: &'a Value, name: &str) -> &'a Value {
    &named(&container["env"], name)["value"]
}

#[test]
fn every_kustomization_renders_and_passes_the_kubernetes_schemas() {
    let dir = scratch_dir("k8s-render");
    std::fs::create_dir_all(&dir).expect("scratch dir");
    for kustomization in kustomizations() {
        let rendered = render(&kustomization);
        let name = kustomization
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_default();
        let file = dir.join(format!("{name}.yaml"));
        std::fs::write(&file, &rendered).expect("write rendered manifests");
        assert!(
            yaml_documents(&rendered).len() >= 5,
            "{name} renders too few objects"
        );
        for version in KUBERNETES_VERSIONS {
            let file = file.to_string_lossy();
            if let Err(e) = run_tool(
                "kubernetes-validate",
                &["--strict", "--quiet", "-k", version, &file],
            ) {
                panic!("{name} fails the Kubernetes {version} schemas:\n{e}");
            }
        }
    }
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn every_manifest_in_the_base_is_part_of_it() {
    let base = k8s().join("base");
    let kustomization =
        std::fs::read_to_string(base.join("kustomization.yaml")).expect("kustomization.yaml");
    let kustomization = &yaml_documents(&kustomization)[0];
    let mut listed: Vec<String> = kustomization["resources"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|r| r.as_str().map(str::to_owned))
        .collect();
    for generator in kustomization["configMapGenerator"]
        .as_array()
        .into_iter()
        .flatten()
    {
        for file in generator["files"].as_array().into_iter().flatten() {
            listed.extend(file.as_str().map(str::to_owned));
        }
    }
    listed.push("kustomization.yaml".to_owned());
    listed.sort();
    let mut present: Vec<String> = std::fs::read_dir(&base)
        .expect("deploy/k8s/base")
        .filter_map(|e| e.ok().map(|e| e.file_name().to_string_lossy().into_owned()))
        .collect();
    present.sort();
    assert_eq!(
        present, listed,
        "files in deploy/k8s/base vs what kustomize uses"
    );
}

#[test]
fn the_agent_pod_runs_clawback_as_a_native_sidecar_on_localhost() {
    let documents = rendered_base();
    let pod = pod_spec(&documents, "Deployment", "openclaw-agent");
    let sidecar = named(&pod["initContainers"], "clawback");
    assert_eq!(
        sidecar["restartPolicy"], "Always",
        "a native sidecar is an init container that keeps running"
    );
    assert_eq!(sidecar["image"], "ghcr.io/clawback/clawback-sidecar:0.1.0");
    assert_eq!(sidecar["args"][0], "serve");

    let port = named(&sidecar["ports"], "clawback")["containerPort"]
        .as_u64()
        .expect("the sidecar's port");
    assert_eq!(sidecar["readinessProbe"]["httpGet"]["path"], "/readyz");
    assert_eq!(sidecar["readinessProbe"]["httpGet"]["port"], "clawback");
    assert_eq!(sidecar["livenessProbe"]["httpGet"]["path"], "/healthz");

    let agent = &pod["containers"][0];
    assert_eq!(
        env_value(agent, "OPENAI_BASE_URL"),
        &Value::from(format!("http://127.0.0.1:{port}/v1")),
        "the agent's base_url points at its sidecar"
    );

    // The sidecar's own config, loaded by the sidecar's loader, listens on that port on all
    // interfaces (the kubelet probes the pod IP) and keeps its data where the volume is.
    let config = Config::load(
        Some(&k8s().join("base/clawback.toml")),
        &Overrides::default(),
    )
    .unwrap_or_else(|e| panic!("deploy/k8s/base/clawback.toml does not load: {e}"));
    assert_eq!(u64::from(config.listen.port()), port);
    assert!(config.listen.ip().is_unspecified(), "{}", config.listen);
    let data_mount = named(&sidecar["volumeMounts"], "clawback-data")["mountPath"].clone();
    assert_eq!(
        Value::from(config.data_dir.to_string_lossy().into_owned()),
        data_mount
    );
    let config_mount = named(&sidecar["volumeMounts"], "clawback-config")["mountPath"]
        .as_str()
        .expect("config mount path");
    assert_eq!(sidecar["args"][2], format!("{config_mount}/clawback.toml"));
    assert!(
        config
            .upstreams
            .iter()
            .any(|u| u.starts_with("http://vllm:")),
        "{:?}",
        config.upstreams
    );

    let grace = pod["terminationGracePeriodSeconds"].as_u64().unwrap_or(30);
    assert!(
        grace > config.timeouts.shutdown_grace.as_secs(),
        "the pod must outlive the sidecar's shutdown grace ({grace}s)"
    );
}

#[test]
fn vllm_serves_runtime_lora_from_the_volume_the_trainer_writes() {
    let documents = rendered_base();
    let vllm = &pod_spec(&documents, "Deployment", "vllm")["containers"][0];
    let args: Vec<&str> = vllm["args"]
        .as_array()
        .expect("vLLM args")
        .iter()
        .filter_map(Value::as_str)
        .collect();
    for flag in ["--enable-lora", "--max-lora-rank=", "--max-loras="] {
        assert!(
            args.iter().any(|a| a.starts_with(flag)),
            "vLLM lacks {flag}: {args:?}"
        );
    }
    assert_eq!(env_value(vllm, "VLLM_ALLOW_RUNTIME_LORA_UPDATING"), "True");

    let trainer_pod = pod_spec(&documents, "Deployment", "clawback-trainer");
    let trainer = &trainer_pod["containers"][0];
    assert_eq!(trainer["resources"]["limits"]["nvidia.com/gpu"], "1");
    assert_eq!(vllm["resources"]["limits"]["nvidia.com/gpu"], "1");

    // Both mount the same claim at the same path: a path the trainer publishes is one vLLM
    // can load.
    let vllm_pod = pod_spec(&documents, "Deployment", "vllm");
    let claim = |pod: &Value| {
        named(&pod["volumes"], "adapters")["persistentVolumeClaim"]["claimName"].clone()
    };
    assert_eq!(claim(vllm_pod), claim(trainer_pod));
    let mount =
        |container: &Value| named(&container["volumeMounts"], "adapters")["mountPath"].clone();
    assert_eq!(mount(vllm), mount(trainer));
    let pvc = find(&documents, "PersistentVolumeClaim", "clawback-adapters");
    assert_eq!(pvc["spec"]["accessModes"][0], "ReadWriteMany");

    // The trainer reads its config from the mounted ConfigMap, and publishes onto that volume.
    let trainer_args: Vec<&str> = trainer["args"]
        .as_array()
        .expect("trainer args")
        .iter()
        .filter_map(Value::as_str)
        .collect();
    assert_eq!(trainer_args[..2], ["train", "--config"]);
    let config_dir = named(&trainer["volumeMounts"], "config")["mountPath"]
        .as_str()
        .expect("config mount")
        .to_owned();
    assert_eq!(trainer_args[2], format!("{config_dir}/trainer.toml"));
    let trainer_toml: toml::Value = toml::from_str(
        &std::fs::read_to_string(k8s().join("base/trainer.toml")).expect("trainer.toml"),
    )
    .expect("trainer.toml parses");
    assert_eq!(
        trainer_toml["publish"]["adapter_root"].as_str(),
        mount(trainer).as_str()
    );
}

#[test]
fn the_managed_redis_overlay_has_no_redis_of_its_own() {
    let documents = yaml_documents(&render(&k8s().join("overlays/managed-redis")));
    assert!(
        !documents.iter().any(|d| d["metadata"]["name"] == "redis"),
        "the bundled Redis is still there"
    );
    let pod = pod_spec(&documents, "Deployment", "openclaw-agent");
    let sidecar = named(&pod["initContainers"], "clawback");
    let redis = named(&sidecar["env"], "CLAWBACK_REDIS");
    assert_eq!(redis["valueFrom"]["secretKeyRef"]["name"], "clawback-redis");
}
