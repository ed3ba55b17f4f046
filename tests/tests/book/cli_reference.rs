//! The command-line reference, rendered from clap's own definition of `clawback-sidecar`:
//! every subcommand's `--help`, as the binary prints it.

/// The reference's generated part, in Markdown.
pub fn render() -> String {
    let mut out = String::new();
    // The values of `env` variables set where the test runs are not the reference's.
    let mut command = hide_env_values(clawback_sidecar::cli::command());
    command.build();
    write(&mut out, &mut command, "clawback-sidecar");
    out
}

fn write(out: &mut String, command: &mut clap::Command, path: &str) {
    let help = command.render_long_help().to_string();
    out.push_str(&format!(
        "### `{path}`\n\n```text\n{}\n```\n\n",
        help.trim_end()
    ));
    let names: Vec<String> = command
        .get_subcommands()
        .filter(|s| s.get_name() != "help")
        .map(|s| s.get_name().to_owned())
        .collect();
    for name in names {
        if let Some(sub) = command.find_subcommand_mut(&name) {
            write(out, sub, &format!("{path} {name}"));
        }
    }
}

fn hide_env_values(command: clap::Command) -> clap::Command {
    command
        .mut_args(|arg| arg.hide_env_values(true))
        .mut_subcommands(hide_env_values)
}
