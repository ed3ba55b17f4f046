//! `tool-outcome`: scores a step by what its tool calls returned. Results that are errors
//! (a non-zero exit, an exception, an `error:` payload, a timeout) pull the reward down, clean
//! results push it up: the reward is (clean - failed) / results, in [-1, 1]. A step whose next
//! state has no tool result gets no opinion.

use clawback_filter_sdk::{export_filter, Evaluation, Filter, NextState, Step};

pub struct ToolOutcome;

impl Filter for ToolOutcome {
    const DESCRIPTION: &'static str =
        "tool results that are errors score negative, clean ones positive";

    fn evaluate_step(_step: Step, next: NextState) -> Evaluation {
        if next.tool_results.is_empty() {
            return Evaluation::none();
        }
        let failures: Vec<Failure> = next
            .tool_results
            .iter()
            .filter_map(|result| failure(&result.content))
            .collect();
        let total = next.tool_results.len() as f64;
        let failed = failures.len() as f64;
        let mut evaluation = Evaluation::reward((total - 2.0 * failed) / total)
            .label("tool_results", next.tool_results.len())
            .label("tool_errors", failures.len());
        if let Some(first) = failures.first() {
            evaluation = evaluation.label("first_error", first.as_str());
        }
        evaluation
    }
}

export_filter!(ToolOutcome);

/// How a tool result failed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Failure {
    ExitCode,
    Exception,
    ErrorPayload,
    Timeout,
}

impl Failure {
    pub fn as_str(self) -> &'static str {
        match self {
            Failure::ExitCode => "exit_code",
            Failure::Exception => "exception",
            Failure::ErrorPayload => "error_payload",
            Failure::Timeout => "timeout",
        }
    }
}

/// Why a tool result is an error, or `None` when it looks clean.
pub fn failure(content: &str) -> Option<Failure> {
    let lower = content.to_lowercase();
    if let Some(code) = exit_code(&lower) {
        return (code != 0).then_some(Failure::ExitCode);
    }
    if lower.contains("timed out")
        || lower.contains("timeout expired")
        || lower.contains("deadline exceeded")
    {
        return Some(Failure::Timeout);
    }
    if lower.contains("traceback (most recent call last)")
        || lower.contains("exception in thread")
        || lower.contains("uncaught exception")
        || lower.contains("panicked at")
        || has_exception_line(content)
    {
        return Some(Failure::Exception);
    }
    let head = lower.trim_start();
    if head.starts_with("error")
        || head.starts_with("fatal:")
        || head.starts_with("command not found")
        || lower.contains("command not found")
        || lower.contains("no such file or directory")
        || lower.contains("permission denied")
        || json_error(head)
    {
        return Some(Failure::ErrorPayload);
    }
    None
}

/// `exit code: 2`, `exit status 1`, `exited with code 1`, `"exit_code": 0`, `returncode=1`.
fn exit_code(lower: &str) -> Option<i64> {
    for marker in [
        "exit code",
        "exit status",
        "exit_code",
        "exited with code",
        "returncode",
        "return code",
    ] {
        if let Some(at) = lower.find(marker) {
            let rest = &lower[at + marker.len()..];
            let digits: String = rest
                .trim_start_matches(|c: char| c == ':' || c == '=' || c == '"' || c.is_whitespace())
                .chars()
                .take_while(|c| c.is_ascii_digit() || *c == '-')
                .collect();
            if let Ok(code) = digits.parse() {
                return Some(code);
            }
        }
    }
    None
}

/// A line such as `ValueError: ...` or `java.lang.NullPointerException: ...`.
fn has_exception_line(content: &str) -> bool {
    content.lines().any(|line| {
        let line = line.trim();
        line.split_once(':').is_some_and(|(name, _)| {
            // A bare `Error:` is a payload, not an exception's name.
            !name.contains(' ')
                && name != "Error"
                && (name.ends_with("Error") || name.ends_with("Exception"))
        })
    })
}

/// A JSON payload whose top level has an `"error"` key with a non-null value.
fn json_error(head: &str) -> bool {
    head.starts_with('{')
        && head
            .find("\"error\"")
            .map(|at| head[at + 7..].trim_start_matches([' ', ':']))
            .is_some_and(|value| {
                !value.starts_with("null")
                    && !value.starts_with("false")
                    && !value.starts_with("\"\"")
            })
}

#[cfg(test)]
mod tests {
    use super::*;
    use clawback_filter_sdk::{Message, ToolResult};

    fn step() -> Step {
        Step {
            index: 0,
            messages: vec![],
            output: Message {
                role: "assistant".into(),
                content: String::new(),
                tool_calls: vec![],
                tool_call_id: None,
                name: None,
            },
            reasoning: None,
            finish_reason: Some("tool_calls".into()),
            metadata: vec![],
            truncated: false,
        }
    }

    fn next(results: &[&str]) -> NextState {
        NextState {
            messages: vec![],
            tool_results: results
                .iter()
                .enumerate()
                .map(|(i, content)| ToolResult {
                    call_id: format!("call_{i}"),
                    name: Some("bash".into()),
                    content: content.to_string(),
                })
                .collect(),
            user_message: None,
            truncated: false,
        }
    }

    #[test]
    fn real_tool_errors_are_recognised() {
        let cases = [
            ("Command exited with code 127\nbash: pytest: command not found", Failure::ExitCode),
            ("{\"stdout\": \"\", \"stderr\": \"boom\", \"exit_code\": 2}", Failure::ExitCode),
            ("Traceback (most recent call last):\n  File \"main.py\", line 3, in <module>\n    import numpyy\nModuleNotFoundError: No module named 'numpyy'", Failure::Exception),
            ("Error: ENOENT: no such file or directory, open '/app/config.json'", Failure::ErrorPayload),
            ("{\"error\": {\"message\": \"Rate limit exceeded\", \"code\": 429}}", Failure::ErrorPayload),
            ("Command timed out after 120 seconds", Failure::Timeout),
            ("thread 'main' panicked at src/main.rs:4:5:\nindex out of bounds", Failure::Exception),
        ];
        for (content, expected) in cases {
            assert_eq!(failure(content), Some(expected), "{content}");
        }
    }

    #[test]
    fn clean_results_are_not_errors() {
        let cases = [
            "total 8\ndrwxr-xr-x 2 agent agent 4096 Mar  3 10:12 src\n-rw-r--r-- 1 agent agent  220 Mar  3 10:12 Cargo.toml",
            "{\"temperature\": 21.5, \"unit\": \"celsius\", \"error\": null}",
            "{\"stdout\": \"ok\\n\", \"exit_code\": 0}",
            "===== 12 passed in 0.84s =====",
            "The error handling section of the docs says retries are automatic.",
        ];
        for content in cases {
            assert_eq!(failure(content), None, "{content}");
        }
    }

    #[test]
    fn the_reward_is_the_balance_of_clean_and_failed_results() {
        let all_clean = ToolOutcome::evaluate_step(step(), next(&["ok", "done"]));
        assert_eq!(all_clean.reward, Some(1.0));
        let all_failed = ToolOutcome::evaluate_step(step(), next(&["Error: nope"]));
        assert_eq!(all_failed.reward, Some(-1.0));
        let half = ToolOutcome::evaluate_step(step(), next(&["ok", "exit code: 1"]));
        assert_eq!(half.reward, Some(0.0));
        assert!(half
            .labels
            .contains(&("first_error".into(), "exit_code".into())));
        assert!(!ToolOutcome::evaluate_step(step(), next(&[])).is_opinion());
    }
}
