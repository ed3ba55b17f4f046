//! The book (`docs/`, mdBook) and the README, checked against the code: the book builds with no
//! warning, every link and anchor in it and in the README resolves, the reference pages'
//! generated parts are what the code renders now (the configuration from its schema, the metrics
//! from what `/metrics` exports, the command line from clap), every documented route is that
//! route in the router, and every `clawback-sidecar` command a page shows parses (the trainer's
//! and the demo's are checked by `trainer/tests/book_commands.rs` and
//! `demo/tests/book_commands.rs`).

mod cli_reference;
mod commands;
mod config_reference;
mod generated;
mod links;
mod metrics_reference;
mod routes;

use std::path::Path;

use clawback_tests::harness::{repo_root, scratch_dir};

#[test]
fn the_book_builds_and_every_link_in_it_and_in_the_readme_resolves() {
    let root = repo_root();
    let out = scratch_dir("book");
    links::build(&root, &out);
    let site = links::Site::read(&out);
    let mut broken = Vec::new();
    let mut checked = 0;
    for page in site.pages() {
        for target in links::links(page) {
            checked += 1;
            if let Some(why) = site.broken(page, &target) {
                broken.push(format!(
                    "{}: {why}",
                    page.strip_prefix(&out).unwrap_or(page).display()
                ));
            }
        }
    }
    assert!(checked > 500, "only {checked} links in the book");
    // The README is read on the forge, not built: its links name files of the repository, and
    // an anchor in a page of the book must be an id of that page as mdBook builds it.
    let readme = std::fs::read_to_string(root.join("README.md")).unwrap_or_default();
    for target in links::markdown_links(&readme) {
        if links::is_external(&target) {
            continue;
        }
        let (path, anchor) = target.split_once('#').unwrap_or((&target, ""));
        if !root.join(path).exists() {
            broken.push(format!("README.md: {target}: no such file"));
            continue;
        }
        if anchor.is_empty() {
            continue;
        }
        let ids = Path::new(path)
            .strip_prefix("docs/src")
            .ok()
            .and_then(|source| site.ids_of_source(source));
        if !ids.is_some_and(|ids| ids.contains(anchor)) {
            broken.push(format!("README.md: {target}: no such anchor in the book"));
        }
    }
    let _ = std::fs::remove_dir_all(&out);
    assert!(broken.is_empty(), "broken links:\n{}", broken.join("\n"));
}

#[test]
fn the_readme_is_a_short_front_door() {
    let readme = std::fs::read_to_string(repo_root().join("README.md")).unwrap_or_default();
    let lines = readme.lines().count();
    assert!(
        lines <= 250,
        "README.md has {lines} lines: the rest belongs in the book"
    );
}

#[test]
fn the_configuration_reference_is_the_schemas() {
    generated::check(
        &repo_root().join("docs/src/reference/configuration.md"),
        &config_reference::render(),
    );
}

#[test]
fn the_metrics_reference_is_what_metrics_exports() {
    generated::check(
        &repo_root().join("docs/src/reference/metrics.md"),
        &metrics_reference::render(),
    );
}

#[test]
fn the_command_line_reference_is_clap_s() {
    generated::check(
        &repo_root().join("docs/src/reference/cli.md"),
        &cli_reference::render(),
    );
}

#[test]
fn every_documented_route_is_that_route_in_the_router() {
    let page =
        std::fs::read_to_string(repo_root().join("docs/src/reference/http.md")).unwrap_or_default();
    let rows = routes::documented(&page);
    assert!(
        rows.len() > 30,
        "the routes page lists {} routes",
        rows.len()
    );
    let wrong: Vec<String> = rows
        .iter()
        .filter_map(|(method, path, label)| routes::mismatch(method, path, label))
        .collect();
    assert!(wrong.is_empty(), "{}", wrong.join("\n"));
}

/// Each is parsed with `--help` after it, as the trainer's and the demo's are run: clap refuses
/// a command, an option or a value that does not exist before it reaches `--help`, and a page
/// may name a command without the arguments it needs (`clawback-sidecar export`).
#[test]
fn every_sidecar_command_the_book_shows_parses() {
    let shown = commands::sidecar_commands(&repo_root());
    assert!(
        shown.len() >= 5,
        "the book shows {} sidecar commands",
        shown.len()
    );
    let refused: Vec<String> = shown
        .iter()
        .filter_map(|(page, args)| {
            let error = clawback_sidecar::cli::command()
                .try_get_matches_from(args.iter().chain(["--help".to_owned()].iter()))
                .err()?;
            (error.kind() != clap::error::ErrorKind::DisplayHelp)
                .then(|| format!("{page}: `{}`: {}", args.join(" "), error.kind()))
        })
        .collect();
    assert!(refused.is_empty(), "{}", refused.join("\n"));
}
