//! The Dockerfiles in `deploy/docker/` cannot rot: docker does not run here, so CI builds the
//! images' binaries with the same cargo commands outside docker (`scripts/test`), and these
//! tests check that each Dockerfile's build command is exactly one CI runs, that the paths it
//! copies out are where that command puts the binary, that it copies every workspace member,
//! and that its toolchain and PyTorch versions are the ones the repository pins.

use clawback_tests::harness::repo_root;

/// One Dockerfile instruction, continuation lines joined, comments dropped.
#[derive(Debug, Clone)]
struct Instruction {
    keyword: String,
    args: String,
}

#[derive(Debug)]
struct Stage {
    from: String,
    name: Option<String>,
    instructions: Vec<Instruction>,
}

impl Stage {
    fn all<'a>(&'a self, keyword: &'a str) -> impl Iterator<Item = &'a str> + 'a {
        self.instructions
            .iter()
            .filter(move |i| i.keyword == keyword)
            .map(|i| i.args.as_str())
    }

    fn workdir(&self) -> &str {
        self.all("WORKDIR").last().unwrap_or("/")
    }
}

struct Dockerfile {
    /// `ARG`s before the first `FROM`, with their defaults.
    global_args: Vec<(String, String)>,
    stages: Vec<Stage>,
}

impl Dockerfile {
    fn read(name: &str) -> Self {
        let path = repo_root().join("deploy/docker").join(name);
        let text =
            std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
        Self::parse(&text)
    }

    fn parse(text: &str) -> Self {
        let mut logical = Vec::new();
        let mut current = String::new();
        for line in text.lines() {
            let trimmed = line.trim();
            if trimmed.starts_with('#') || (trimmed.is_empty() && current.is_empty()) {
                continue;
            }
            match trimmed.strip_suffix('\\') {
                Some(head) => {
                    current.push_str(head.trim());
                    current.push(' ');
                }
                None => {
                    current.push_str(trimmed);
                    logical.push(std::mem::take(&mut current));
                }
            }
        }
        let mut dockerfile = Dockerfile {
            global_args: Vec::new(),
            stages: Vec::new(),
        };
        for line in logical.iter().filter(|l| !l.is_empty()) {
            let (keyword, args) = line.split_once(' ').unwrap_or((line.as_str(), ""));
            let keyword = keyword.to_ascii_uppercase();
            let args = args.trim().to_owned();
            if keyword == "FROM" {
                let words: Vec<&str> = args.split_whitespace().collect();
                let name = match words.as_slice() {
                    [_, as_, name] if as_.eq_ignore_ascii_case("as") => Some(name.to_string()),
                    _ => None,
                };
                dockerfile.stages.push(Stage {
                    from: words.first().map(|w| w.to_string()).unwrap_or_default(),
                    name,
                    instructions: Vec::new(),
                });
            } else if let Some(stage) = dockerfile.stages.last_mut() {
                stage.instructions.push(Instruction { keyword, args });
            } else if keyword == "ARG" {
                let (name, default) = args.split_once('=').unwrap_or((args.as_str(), ""));
                dockerfile
                    .global_args
                    .push((name.to_owned(), default.to_owned()));
            }
        }
        dockerfile
    }

    fn stage(&self, name: &str) -> &Stage {
        self.stages
            .iter()
            .find(|s| s.name.as_deref() == Some(name))
            .unwrap_or_else(|| panic!("no stage named {name}"))
    }

    fn runtime(&self) -> &Stage {
        self.stages.last().expect("a Dockerfile has a stage")
    }

    /// `FROM` with the global `ARG` defaults substituted.
    fn base(&self, stage: &Stage) -> String {
        let mut from = stage.from.clone();
        for (name, default) in &self.global_args {
            from = from.replace(&format!("${{{name}}}"), default);
        }
        from
    }
}

/// What a `cargo build` command line asks for.
#[derive(Debug, PartialEq)]
struct CargoBuild {
    line: String,
    package: String,
    bin: String,
    target: Option<String>,
    profile: &'static str,
}

impl CargoBuild {
    fn parse(line: &str) -> Self {
        let words: Vec<&str> = line.split_whitespace().collect();
        assert_eq!(words[..2], ["cargo", "build"], "{line}");
        let after = |flag: &str| {
            words
                .iter()
                .position(|w| *w == flag)
                .and_then(|i| words.get(i + 1))
                .map(|w| w.to_string())
        };
        assert!(
            words.contains(&"--locked"),
            "builds must use Cargo.lock: {line}"
        );
        CargoBuild {
            line: line.to_owned(),
            package: after("-p").unwrap_or_else(|| panic!("no -p in {line}")),
            bin: after("--bin").unwrap_or_else(|| panic!("no --bin in {line}")),
            target: after("--target"),
            profile: if words.contains(&"--release") {
                "release"
            } else {
                "debug"
            },
        }
    }

    /// Where the binary lands, relative to the workspace root.
    fn output(&self) -> String {
        match &self.target {
            Some(target) => format!("target/{target}/{}/{}", self.profile, self.bin),
            None => format!("target/{}/{}", self.profile, self.bin),
        }
    }
}

/// The one `RUN cargo build ...` of the build stage.
fn cargo_build(stage: &Stage) -> CargoBuild {
    let builds: Vec<&str> = stage
        .all("RUN")
        .filter(|run| run.starts_with("cargo build"))
        .collect();
    assert_eq!(builds.len(), 1, "one cargo build per image: {builds:?}");
    CargoBuild::parse(builds[0])
}

fn manifest(relative: &str) -> toml::Table {
    read(relative)
        .parse()
        .unwrap_or_else(|e| panic!("{relative}: {e}"))
}

fn strings(value: Option<&toml::Value>) -> Vec<String> {
    value
        .and_then(toml::Value::as_array)
        .into_iter()
        .flatten()
        .filter_map(|v| v.as_str().map(str::to_owned))
        .collect()
}

fn read(relative: &str) -> String {
    let path = repo_root().join(relative);
    std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

/// The workspace members, from the root Cargo.toml.
fn workspace_members() -> Vec<String> {
    let members = strings(manifest("Cargo.toml")["workspace"].get("members"));
    assert!(!members.is_empty(), "no workspace.members in Cargo.toml");
    members
}

/// The folder of the workspace member whose package is `package`.
fn package_manifest(package: &str) -> toml::Table {
    workspace_members()
        .into_iter()
        .map(|member| manifest(&format!("{member}/Cargo.toml")))
        .find(|m| m["package"]["name"].as_str() == Some(package))
        .unwrap_or_else(|| panic!("no workspace member is the package {package}"))
}

/// The checks both images share; returns the build stage's cargo command.
fn check_image(dockerfile: &Dockerfile, name: &str) -> CargoBuild {
    let build = dockerfile.stage("build");
    let runtime = dockerfile.runtime();
    assert!(
        runtime.name.is_none() || runtime.name.as_deref() != Some("build"),
        "{name}: the runtime stage is not the build stage (multi-stage)"
    );
    let cargo = cargo_build(build);

    // The very command CI runs outside docker.
    let ci = read("scripts/test");
    assert!(
        ci.lines().any(|l| l.trim() == cargo.line),
        "{name}: scripts/test does not run `{}`",
        cargo.line
    );

    // The package is a workspace member with that binary.
    let bins: Vec<String> = package_manifest(&cargo.package)
        .get("bin")
        .and_then(toml::Value::as_array)
        .into_iter()
        .flatten()
        .filter_map(|bin| bin.get("name").and_then(toml::Value::as_str))
        .map(str::to_owned)
        .collect();
    assert!(
        bins.contains(&cargo.bin) || cargo.bin == cargo.package,
        "{name}: {} has no binary {} ({bins:?})",
        cargo.package,
        cargo.bin
    );

    // Every workspace member and the lock file are copied in (cargo needs all manifests), and
    // every copied path exists.
    let copies: Vec<Vec<String>> = build
        .all("COPY")
        .filter(|c| !c.starts_with("--from"))
        .map(|c| c.split_whitespace().map(str::to_owned).collect())
        .collect();
    let sources: Vec<String> = copies
        .iter()
        .flat_map(|words| words[..words.len().saturating_sub(1)].to_vec())
        .collect();
    for needed in ["Cargo.toml", "Cargo.lock"]
        .into_iter()
        .map(str::to_owned)
        .chain(workspace_members())
    {
        assert!(
            sources.contains(&needed),
            "{name}: the build stage does not copy {needed} (copies {sources:?})"
        );
    }
    for source in &sources {
        assert!(
            repo_root().join(source).exists(),
            "{name}: copies {source}, which is not in the repository"
        );
    }

    // The binary is copied out of the place the command puts it, and is the entrypoint.
    let built = format!(
        "{}/{}",
        build.workdir().trim_end_matches('/'),
        cargo.output()
    );
    let copied_out: Vec<&str> = runtime
        .all("COPY")
        .filter(|c| c.starts_with("--from=build"))
        .collect();
    let binary_copy = copied_out
        .iter()
        .find_map(|c| {
            let words: Vec<&str> = c.split_whitespace().collect();
            (words.get(1) == Some(&built.as_str())).then(|| words.last().map(|w| w.to_string()))
        })
        .flatten()
        .unwrap_or_else(|| panic!("{name}: nothing copies {built} out of the build stage"));
    let entrypoint = runtime
        .all("ENTRYPOINT")
        .last()
        .unwrap_or_else(|| panic!("{name}: no ENTRYPOINT"));
    assert_eq!(
        entrypoint,
        format!("[\"{binary_copy}\"]"),
        "{name}: the entrypoint is the copied binary"
    );

    // The Rust the image builds with is at least the workspace's rust-version.
    let rust_version = manifest("Cargo.toml")["workspace"]["package"]["rust-version"]
        .as_str()
        .expect("workspace.package.rust-version")
        .to_owned();
    let image_rust = build
        .all("ARG")
        .find_map(|a| a.strip_prefix("RUST_VERSION="))
        .map(str::to_owned)
        .or_else(|| {
            dockerfile
                .base(build)
                .strip_prefix("rust:")
                .map(|t| t.split('-').next().unwrap_or_default().to_owned())
        })
        .unwrap_or_else(|| panic!("{name}: cannot tell which Rust the image uses"));
    assert!(
        version_at_least(&image_rust, &rust_version),
        "{name}: Rust {image_rust} is older than the workspace's rust-version {rust_version}"
    );
    cargo
}

fn version_at_least(have: &str, need: &str) -> bool {
    let parse = |v: &str| -> Vec<u64> { v.split('.').map(|p| p.parse().unwrap_or(0)).collect() };
    parse(have) >= parse(need)
}

#[test]
fn the_sidecar_image_is_a_static_binary_built_as_ci_builds_it() {
    let dockerfile = Dockerfile::read("sidecar.Dockerfile");
    let cargo = check_image(&dockerfile, "sidecar.Dockerfile");
    assert_eq!(cargo.package, "clawback-sidecar");
    let target = cargo.target.as_deref().expect("a --target");
    assert!(
        target.ends_with("-musl"),
        "static: a musl target, not {target}"
    );
    let build = dockerfile.stage("build");
    assert!(
        build
            .all("RUN")
            .any(|r| r == format!("rustup target add {target}")),
        "the build stage adds the {target} target"
    );
    let base = dockerfile.base(dockerfile.runtime());
    assert!(
        base.starts_with("gcr.io/distroless/static"),
        "a static binary needs no libc: {base}"
    );
    // No libtorch anywhere near the sidecar.
    let dependencies = &package_manifest("clawback-sidecar")["dependencies"];
    for torch in ["tch", "torch-sys"] {
        assert!(
            dependencies.get(torch).is_none(),
            "the sidecar depends on {torch}"
        );
    }

    let runtime = dockerfile.runtime();
    let exposed: Vec<&str> = runtime.all("EXPOSE").collect();
    let listen = runtime
        .all("ENV")
        .flat_map(|e| e.split_whitespace())
        .find_map(|kv| kv.strip_prefix("CLAWBACK_LISTEN="))
        .expect("the image sets CLAWBACK_LISTEN");
    let port = listen.rsplit(':').next().unwrap_or_default();
    assert_eq!(exposed, [port], "EXPOSE matches the listen port");
}

#[test]
fn the_trainer_image_links_the_pytorch_the_repository_pins() {
    let dockerfile = Dockerfile::read("trainer.Dockerfile");
    let cargo = check_image(&dockerfile, "trainer.Dockerfile");
    assert_eq!(cargo.package, "clawback-trainer");

    // Both stages on PyTorch's images, of the minor version scripts/ensure-torch installs.
    let pinned = read("scripts/ensure-torch")
        .lines()
        .find_map(|l| l.trim().strip_prefix("torch_spec='torch=="))
        .map(|v| v.trim_end_matches("'").trim_end_matches(".*").to_owned())
        .expect("scripts/ensure-torch pins torch_spec");
    for stage in &dockerfile.stages {
        let base = dockerfile.base(stage);
        let tag = base
            .strip_prefix("pytorch/pytorch:")
            .unwrap_or_else(|| panic!("not a PyTorch image: {base}"));
        assert!(
            tag.starts_with(&format!("{pinned}.")),
            "{base} is not PyTorch {pinned}.x"
        );
    }
    assert!(dockerfile.base(dockerfile.runtime()).ends_with("-runtime"));

    // torch-sys finds libtorch through the `.torch` link that .cargo/config.toml names.
    let config = read(".cargo/config.toml");
    assert!(config.contains("LIBTORCH = { value = \".torch\", relative = true }"));
    let build = dockerfile.stage("build");
    assert!(build.all("COPY").any(|c| c == ".cargo .cargo"));
    assert!(build
        .all("RUN")
        .any(|r| r.starts_with("ln -sfn") && r.ends_with(" .torch")));
}
